"""``kvhybrid-launch``: run a training script on N MPI ranks with kvhybrid's settings.

    kvhybrid-launch -n 4 python train.py --epochs 3
    kvhybrid-launch -n 8 -H node1:4,node2:4 python train.py

Prints the mpirun command it runs, forwards ``KVHYBRID_*``, ``MXNET_*``,
``OMP_*`` and ``DMLC_*`` variables to every rank, and exits with the job's
exit code. Bad arguments exit with code 2 and start nothing.
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
from typing import List, Optional

from .mpirun import DEFAULT_ENV, MpiJob, build_command, find_mpirun, flavour, job_env

log = logging.getLogger("kvhybrid.launch")


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="kvhybrid-launch", description=__doc__.split("\n\n")[0],
        epilog="Variables set for every rank unless already set: "
               + ", ".join(f"{k}={v}" for k, v in DEFAULT_ENV.items()))
    p.add_argument("-n", "--num-workers", type=int, required=True, metavar="N",
                   help="number of worker processes (MPI ranks)")
    p.add_argument("-H", "--hosts", help="hosts and slots, e.g. node1:4,node2:4 (default: this machine)")
    p.add_argument("--hostfile", help="an MPI hostfile ('host slots=N' lines)")
    p.add_argument("--servers", type=int, default=0,
                   help="parameter servers; only 0 (pure MPI) is supported so far")
    p.add_argument("--mpi-args", default="", help="extra arguments for mpirun, quoted")
    p.add_argument("--dry-run", action="store_true", help="print the command and exit")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, e.g. python train.py")
    args = p.parse_args(argv)
    if args.num_workers < 1:
        p.error(f"-n must be at least 1, got {args.num_workers}")
    if args.servers != 0:
        p.error(f"--servers {args.servers}: only --servers 0 (pure MPI) is supported so far")
    if args.hosts and args.hostfile:
        p.error("give either -H/--hosts or --hostfile, not both")
    if args.hostfile and not os.path.isfile(args.hostfile):
        p.error(f"--hostfile {args.hostfile}: no such file")
    if not args.command:
        p.error("missing the command to run, e.g. kvhybrid-launch -n 4 python train.py")
    if shutil.which(args.command[0]) is None and not os.path.isfile(args.command[0]):
        p.error(f"command {args.command[0]!r} not found")
    scripts = [c for c in args.command[1:2] if c.endswith(".py")]
    if scripts and not os.path.isfile(scripts[0]):
        p.error(f"script {scripts[0]!r} not found")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="kvhybrid-launch: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        mpirun = find_mpirun()
    except FileNotFoundError as exc:
        print(f"kvhybrid-launch: {exc}", file=sys.stderr)
        return 2
    env = job_env({})
    command = list(args.command)
    if command[0] in ("python", "python3"):
        command[0] = sys.executable  # the interpreter (and virtual environment) of the launcher
    job = MpiJob(args.num_workers, command, args.hosts, args.hostfile,
                 extra_args=shlex.split(args.mpi_args))
    cmd = build_command(job, mpirun, flavour(mpirun), env)
    log.info("%d workers in 1 client group, 0 servers (pure MPI)", args.num_workers)
    log.info("running: %s", shlex.join(cmd))
    if args.dry_run:
        return 0
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    proc = subprocess.Popen(cmd, env=env)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:  # mpirun got the SIGINT too (same process group) and stops the ranks
        proc.send_signal(signal.SIGINT)
        rc = proc.wait()
    if rc != 0:
        log.error("the job failed with exit code %d (see the ranks' output above)", rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
