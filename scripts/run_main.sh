#!/usr/bin/env bash
# The main job: set up (if needed), then train a Gluon MLP on 4 local MPI ranks
# through the hybrid-mpi store. Extra arguments go to examples/train_mlp.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kvhybrid-launch -n 4 python examples/train_mlp.py "$@"
