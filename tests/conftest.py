import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "workers"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
