#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine (as root): Open MPI, a virtual
# environment with pinned packages, Horovod built against MXNet, and kvhybrid itself.
# Re-running it is quick: each step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVHYBRID_VENV:-.venv}
log() { printf '[setup] %s\n' "$*"; }

if ! command -v mpirun >/dev/null 2>&1 || ! [ -e /usr/include/x86_64-linux-gnu/openmpi ] && ! command -v mpicc >/dev/null 2>&1; then
  log "installing Open MPI from Debian (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq openmpi-bin libopenmpi-dev python3-venv >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
stamp="$VENV/.kvhybrid-requirements.sha"
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing pinned packages (requirements.txt)"
  "$PY" -m pip install -q --upgrade pip wheel setuptools
  "$PY" -m pip install -q -r requirements.txt
  echo "$want" > "$stamp"
fi

if ! "$PY" -c 'import horovod.mxnet' >/dev/null 2>&1; then
  log "building Horovod 0.28.1 with MXNet and MPI (about 4 minutes on 2 cores)"
  HOROVOD_WITH_MXNET=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
  HOROVOD_WITHOUT_GLOO=1 MAKEFLAGS=-j2 \
    "$PY" -m pip install -q --no-cache-dir --no-build-isolation horovod==0.28.1
fi

if ! "$PY" -c 'import kvhybrid' >/dev/null 2>&1; then
  log "installing kvhybrid (editable)"
  "$PY" -m pip install -q --no-deps --no-build-isolation -e .
fi
log "ready: $VENV"
