#!/usr/bin/env bash
# Set-up for a fresh Debian 12 machine, as root: Open MPI and a build toolchain (apt),
# a virtual environment with pinned packages, Horovod built against MXNet, and
# kvhybrid itself. Idempotent: a step whose result is already there is skipped,
# so running it again takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVHYBRID_VENV:-.venv}
PYTHON=${PYTHON:-python3}
log() { printf '[setup] %s\n' "$*"; }

need_apt=0
for tool in mpirun mpicc g++ cmake "$PYTHON"; do
  command -v "$tool" >/dev/null 2>&1 || need_apt=1
done
"$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt=1
if [ "$need_apt" = 1 ]; then
  log "installing Open MPI, compilers and Python headers (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq openmpi-bin libopenmpi-dev build-essential cmake \
    python3 python3-dev python3-venv >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
stamp="$VENV/.kvhybrid-requirements.sha"
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing pinned packages (requirements.txt)"
  "$PY" -m pip install -q --disable-pip-version-check --upgrade pip wheel setuptools
  "$PY" -m pip install -q --disable-pip-version-check -r requirements.txt
  # pinned here once: MXNet imports scipy wherever it is installed (requirements.txt)
  "$PY" -m pip uninstall -q -y scikit-learn scipy joblib threadpoolctl >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
fi

if ! "$PY" -c 'import horovod.mxnet' >/dev/null 2>&1; then
  log "building Horovod 0.28.1 against MXNet and MPI (about 4 minutes on 2 cores)"
  HOROVOD_WITH_MXNET=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_GLOO=1 MAKEFLAGS=-j"$(nproc)" \
    "$PY" -m pip install -q --disable-pip-version-check --no-cache-dir --no-build-isolation \
      horovod==0.28.1
fi

# the C++ helpers (kvhybrid/tensor_collectives/ndarray_aux.cc, built in place against MXNet,
# host_barrier.cc, engine_start.cc, rows.cc, ids.cc, patient_wait.cc and
# kvhybrid/kvstore/sgd_update.cc) (a glob, not ls: on a fresh clone there is no match, and
# ls's exit status would end this script)
helper=$(compgen -G 'kvhybrid/tensor_collectives/_ndarray_aux*.so' | head -n 1 || true)
barrier=$(compgen -G 'kvhybrid/tensor_collectives/_host_barrier*.so' | head -n 1 || true)
sgd=$(compgen -G 'kvhybrid/kvstore/_sgd_update*.so' | head -n 1 || true)
start=$(compgen -G 'kvhybrid/tensor_collectives/_engine_start*.so' | head -n 1 || true)
rows=$(compgen -G 'kvhybrid/tensor_collectives/_rows*.so' | head -n 1 || true)
ids=$(compgen -G 'kvhybrid/tensor_collectives/_ids*.so' | head -n 1 || true)
patient=$(compgen -G 'kvhybrid/tensor_collectives/_patient_wait*.so' | head -n 1 || true)
if ! "$PY" -c 'import kvhybrid, kvhybrid.launch.cli' >/dev/null 2>&1 || [ ! -x "$VENV/bin/kvhybrid-launch" ] \
    || [ -z "$helper" ] || [ kvhybrid/tensor_collectives/ndarray_aux.cc -nt "$helper" ] \
    || [ -z "$barrier" ] || [ kvhybrid/tensor_collectives/host_barrier.cc -nt "$barrier" ] \
    || [ -z "$sgd" ] || [ kvhybrid/kvstore/sgd_update.cc -nt "$sgd" ] \
    || [ -z "$start" ] || [ kvhybrid/tensor_collectives/engine_start.cc -nt "$start" ] \
    || [ -z "$rows" ] || [ kvhybrid/tensor_collectives/rows.cc -nt "$rows" ] \
    || [ -z "$ids" ] || [ kvhybrid/tensor_collectives/ids.cc -nt "$ids" ] \
    || [ -z "$patient" ] || [ kvhybrid/tensor_collectives/patient_wait.cc -nt "$patient" ] \
    || [ kvhybrid/tensor_collectives/ids_in_table.h -nt "$ids" ] \
    || [ kvhybrid/tensor_collectives/ids_in_table.h -nt "$helper" ]; then
  log "installing kvhybrid (editable, its C++ helper built against MXNet)"
  install_log="$VENV/kvhybrid-install.log"
  if ! "$PY" -m pip install --disable-pip-version-check --no-deps --no-build-isolation -e . >"$install_log" 2>&1; then
    tail -n 40 "$install_log" >&2
    log "installing kvhybrid failed; the whole log is $install_log"
    exit 1
  fi
fi
log "ready: $VENV ($("$PY" -c 'import mxnet, mpi4py, horovod; print("mxnet", mxnet.__version__, "mpi4py", mpi4py.__version__, "horovod", horovod.__version__)' 2>/dev/null))"
