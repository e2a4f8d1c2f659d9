#!/usr/bin/env bash
# The main job: set up (if needed), then train a Gluon MLP through the hybrid-mpi store
# on this machine: a ps-lite scheduler, 2 parameter servers and 2 client groups of 2 MPI
# ranks each (4 workers). Extra arguments go to examples/train_mlp.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kvhybrid-launch -n 4 --clients 2 --servers 2 python examples/train_mlp.py "$@"
