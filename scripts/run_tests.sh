#!/usr/bin/env bash
# The tests: set up (if needed), then run the whole suite. Distributed tests start
# real mpirun jobs and (for the benchmark smoke test) real ps-lite servers on loopback.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec .venv/bin/python -m pytest -p no:cacheprovider --timeout 900 -q "$@" tests
