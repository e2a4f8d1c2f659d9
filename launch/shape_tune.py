"""``kvhybrid-launch --tune``: choose a job's shape (client groups, servers, row masters) by
running short trials of the user's own command.

Each trial is the job itself, started through the launcher in one shape and stopped once
rank 0 has written ``TRIAL_STEPS`` step times after the warm-up (``KVHYBRID_STATS_STEPS``),
or cut off at a per-trial timeout; its step time is their median (``KVHYBRID_STATS_FILE``,
as ``--tune-partitions`` reads it). The shapes form a small grid:
client groups 1, one per host, one per worker; servers 0, one per host, two per host; and,
for one group spanning hosts with servers, rows aggregated by the group's master or per host.

The search, and why it needs few trials:

* first the remembered shape (if any), then the two extremes: pure MPI (one group, no
  servers: every sum by allreduce) and all-PS (a group per worker, a server per host);
* then hill-climbing from the fastest shape measured, one knob at a time: its neighbours on
  the grid are the only candidates, since a step's cost changes steadily along each knob;
* a step is modelled as a part set by the client groups (how dense sums travel) plus a part
  set by the servers (where rows and cross-group sums go): a candidate that completes a
  rectangle of measured shapes is predicted from it, and pruned when the prediction is
  slower than the best by more than the noise margin;
* a dense-only model (no row_sparse keys in a trial's stats) gives a single group's servers
  nothing to hold, so one group with servers is pruned as pure MPI plus idle processes;
* once no untried shape can win, the best is tried again if a trial is left and another
  measured shape is near it: the two trials' difference is how much trials of one shape swing
  here, which becomes the noise margin, and the search goes on with the shapes it no longer
  rules out; the pick names the shapes the trials cannot tell from it;
* at most ``MAX_TRIALS`` trials, and none started that the budget cannot fit.

The pick is the fastest trial; with servers and row_sparse keys its partition count is then
searched by ``tune.tune``. The result is remembered per job (the command, workers and hosts)
in ``KVHYBRID_CACHE_DIR``: a plain run of the same job starts in that shape, and a later
``--tune`` starts its search from it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import tune
from .supervisor import Terminated, signals_interrupt

log = logging.getLogger("kvhybrid.launch")

#: trials of shapes, all together (the partition search has its own count)
MAX_TRIALS = 6
#: a candidate is pruned only when predicted slower than the best by more than this share:
#: trial-to-trial noise on a shared machine (at least; a repeat of the best may widen it)
NOISE = 0.05
#: the best shape is tried a second time, where a trial is left, when another measured shape
#: lies within this share of it: whole jobs of one shape can differ by tens of percent on a
#: shared machine, and the two trials' difference becomes the search's noise margin
REPEAT_WITHIN = 0.5
#: a trial may take this many times the slowest successful trial before it is cut off
TIMEOUT_FACTOR = 3.0
#: ... but never less than this many seconds (a job's start-up alone takes seconds)
MIN_TRIAL_TIMEOUT = 60.0
#: seconds between SIGTERM to a cut-off trial's launcher (which stops its job) and SIGKILL
STOP_GRACE = 15.0
#: step times a trial measures after the warm-up; rank 0 writes its stats as the next step
#: begins (KVHYBRID_STATS_STEPS) and the trial is stopped there, however long the job
TRIAL_STEPS = 20
#: seconds between looks at a running trial's stats file
POLL = 0.25
DEFAULT_BUDGET = 600.0


@dataclass(frozen=True, order=True)
class Shape:
    """One way to run the job: client groups, parameter servers, who pushes rows."""
    clients: int
    servers: int
    row_masters: str = "group"

    def __post_init__(self):
        if self.clients < 1 or self.servers < 0:
            raise ValueError(f"a shape needs clients >= 1 and servers >= 0, got {self}")
        if self.row_masters not in ("group", "host"):
            raise ValueError(f"row_masters is 'group' or 'host', got {self.row_masters!r}")

    @property
    def server_setting(self) -> Tuple[int, str]:
        """The knob the servers set (the model's second part)."""
        return self.servers, self.row_masters

    def flags(self) -> List[str]:
        return ["--clients", str(self.clients), "--servers", str(self.servers),
                "--row-masters", self.row_masters]

    def describe(self) -> str:
        if self.servers == 0:
            return (f"{self.clients} group, 0 servers (pure MPI)" if self.clients == 1 else
                    f"{self.clients} groups, 0 servers")
        text = (f"{self.clients} group{'s' if self.clients > 1 else ''}, {self.servers} "
                f"server{'s' if self.servers > 1 else ''}")
        return text + (", rows by host" if self.row_masters == "host" else "")


@dataclass(frozen=True)
class Grid:
    """The shapes ``workers`` workers on ``hosts`` hosts allow, and why others are not."""
    workers: int
    hosts: int

    def __post_init__(self):
        if self.workers < 1 or not 1 <= self.hosts <= self.workers:
            raise ValueError(f"a grid needs 1 <= hosts <= workers, got {self}")

    @property
    def client_levels(self) -> List[int]:
        return sorted({1, self.hosts, self.workers})

    @property
    def server_levels(self) -> List[int]:
        return sorted({0, self.hosts, 2 * self.hosts})

    def shapes(self) -> List[Shape]:
        """Every shape of the grid, allowed or not (``why_not`` says)."""
        out = []
        for c in self.client_levels:
            for s in self.server_levels:
                out.append(Shape(c, s))
                if c == 1 and s and self.hosts > 1:
                    out.append(Shape(c, s, "host"))
        return out

    def why_not(self, shape: Shape) -> Optional[str]:
        if self.workers % shape.clients:
            return f"{self.workers} workers do not split into {shape.clients} equal groups"
        if shape.clients > 1 and shape.servers == 0:
            return "client groups talk through servers"
        return None

    def allowed(self) -> List[Shape]:
        return [s for s in self.shapes() if self.why_not(s) is None]

    def pure_mpi(self) -> Shape:
        return Shape(1, 0)

    def all_ps(self) -> Shape:
        return Shape(self.workers, self.hosts)

    def neighbours(self, shape: Shape) -> List[Shape]:
        """Allowed shapes one knob away: one level more or fewer groups (servers added
        when more groups would have none), servers, or the other row masters. Several groups
        become one group with either row masters: rows by host keeps the per-host sums that
        a group per host made."""
        cl, sl = self.client_levels, self.server_levels
        ci, si = cl.index(shape.clients), sl.index(shape.servers)
        found = []
        for j in (ci - 1, ci + 1):
            if 0 <= j < len(cl):
                servers = shape.servers or (self.hosts if cl[j] > 1 else 0)
                if cl[j] > 1:
                    masters = ["group"]
                elif shape.clients > 1 and servers and self.hosts > 1:
                    masters = ["group", "host"]
                else:
                    masters = [shape.row_masters]
                found.extend(Shape(cl[j], servers, m) for m in masters)
        for j in (si - 1, si + 1):
            if 0 <= j < len(sl):
                host = shape.row_masters == "host" and sl[j] > 0
                found.append(Shape(shape.clients, sl[j], "host" if host else "group"))
        if shape.clients == 1 and shape.servers and self.hosts > 1:
            found.append(Shape(1, shape.servers,
                               "group" if shape.row_masters == "host" else "host"))
        return [s for s in dict.fromkeys(found) if s != shape and self.why_not(s) is None]


@dataclass
class Outcome:
    """What became of one shape: measured, failed, pruned or left untried, and why."""
    shape: Shape
    status: str = "not tried"       # measured | failed | pruned | not allowed | not tried
    seconds: Optional[float] = None  # median step time (measured)
    reason: str = ""
    trial: Optional[int] = None     # its place among the trials
    wall: Optional[float] = None    # the trial's whole run, start-up included
    runs: List[float] = field(default_factory=list)   # each trial's step time (measured)
    repeat: Optional[int] = None    # the second trial's place, where the shape was repeated


@dataclass
class ShapeSearch:
    """Which shape to try next; feed each trial back with ``record`` or ``fail``."""
    grid: Grid
    start: Optional[Shape] = None
    dense_only: Optional[bool] = None   # None: not known yet
    max_trials: int = MAX_TRIALS
    outcomes: Dict[Shape, Outcome] = field(default_factory=dict)
    #: shapes within this share of the best count as its equals (``NOISE``, or what a repeat
    #: of the best showed)
    noise: float = NOISE
    repeated: Optional[Shape] = None

    def __post_init__(self):
        if self.max_trials < 2:
            raise ValueError(f"max_trials must be >= 2 (the two extremes), got {self.max_trials}")
        for s in self.grid.shapes():
            why = self.grid.why_not(s)
            self.outcomes[s] = Outcome(s, "not allowed", reason=why) if why else Outcome(s)
        if self.start is not None and self.grid.why_not(self.start) is not None:
            self.start = None
        first = [self.start, self.grid.pure_mpi(), self.grid.all_ps()]
        self._opening = [s for s in dict.fromkeys(first) if s is not None]

    @property
    def trials(self) -> int:
        return sum((o.trial is not None) + (o.repeat is not None)
                   for o in self.outcomes.values())

    def measured(self) -> Dict[Shape, float]:
        return {s: o.seconds for s, o in self.outcomes.items() if o.status == "measured"}

    def best(self) -> Optional[Shape]:
        m = self.measured()
        return min(m, key=m.get) if m else None

    def predict(self, shape: Shape) -> Optional[float]:
        """Seconds per step from the measured rectangles through ``shape``: the shape with
        its groups and another server setting, plus what the server setting changed where
        both were measured (groups and servers as two additive parts); None if none."""
        m = self.measured()
        guesses = []
        for corner in m:   # the rectangle's corner opposite ``shape``
            if corner.clients == shape.clients or corner.server_setting == shape.server_setting:
                continue
            same_groups = Shape(shape.clients, *corner.server_setting)
            same_servers = Shape(corner.clients, *shape.server_setting)
            if same_groups in m and same_servers in m:
                guesses.append(m[same_groups] + m[same_servers] - m[corner])
        return sum(guesses) / len(guesses) if guesses else None

    def _idle_servers(self, shape: Shape) -> Optional[str]:
        if self.dense_only and shape.clients == 1 and shape.servers:
            return "dense-only model: one group's servers would hold nothing"
        return None

    def _prune_reason(self, shape: Shape, best: float) -> Optional[str]:
        idle = self._idle_servers(shape)
        if idle:
            return idle
        guess = self.predict(shape)
        if guess is not None and guess > best * (1 + self.noise):
            return f"predicted {guess * 1e3:.1f} ms, best {best * 1e3:.1f}"
        return None

    def next(self) -> Optional[Shape]:
        """The next shape to try, or None when no untried shape can win (or trials are
        spent)."""
        if self.trials >= self.max_trials:
            return None
        while self._opening:
            s = self._opening.pop(0)
            if self.outcomes[s].trial is None:
                idle = self._idle_servers(s)
                if idle:
                    self.outcomes[s].status, self.outcomes[s].reason = "pruned", idle
                    continue
                return s
        best = self.best()
        if best is None:
            return None
        candidates = []
        for rank, near in enumerate(self.contenders()):
            for s in self.grid.neighbours(near):
                o = self.outcomes[s]
                if o.trial is not None:
                    continue
                why = self._prune_reason(s, self.measured()[best])
                if why:
                    o.status, o.reason = "pruned", why
                    continue
                o.status, o.reason = "not tried", ""
                guess = self.predict(s)
                candidates.append((rank, guess is not None, guess or 0.0, s))
        # the best's neighbours first, then those of shapes within the noise of it; of
        # each, unpredictable shapes first: the model cannot rule them out
        return min(candidates)[-1] if candidates else self._repeat()

    def _repeat(self) -> Optional[Shape]:
        """The best shape once more (see ``REPEAT_WITHIN``), or None: done already, or no
        other measured shape near enough for a trial's swing to change the pick."""
        m, best = self.measured(), self.best()
        if self.repeated is not None or best is None:
            return None
        near = any(s != best and t <= m[best] * (1 + REPEAT_WITHIN) for s, t in m.items())
        return best if near else None

    def contenders(self) -> List[Shape]:
        """The best shape, then the measured shapes within the trials' noise of it (any of
        them may be the fastest), fastest first."""
        m = self.measured()
        best = self.best()
        return sorted((s for s in m if m[s] <= m[best] * (1 + self.noise)), key=m.get) \
            if best else []

    def equals(self, chosen: Shape) -> List[Shape]:
        """The other measured shapes within the noise margin of ``chosen``: the trials
        cannot tell them from it."""
        return [s for s in self.contenders() if s != chosen]

    def record(self, shape: Shape, seconds: float, wall: Optional[float] = None) -> None:
        o = self.outcomes[shape]
        if o.status == "measured":   # the repeat: the shape's mean, the margin its swing
            o.runs.append(seconds)
            o.seconds, o.repeat = sum(o.runs) / len(o.runs), self.trials + 1
            self.repeated = shape
            self.noise = max(NOISE, (max(o.runs) - min(o.runs)) / min(o.runs))
        else:
            o.status, o.seconds, o.reason, o.runs = "measured", seconds, "", [seconds]
            o.trial, o.wall = self.trials + 1, wall
        # a shape pruned against an earlier best is judged again against the new one
        for other in self.outcomes.values():
            if other.status == "pruned":
                other.status, other.reason = "not tried", ""

    def fail(self, shape: Shape, reason: str, wall: Optional[float] = None) -> None:
        o = self.outcomes[shape]
        if o.status == "measured":   # its repeat failed: the first trial's time stands
            o.repeat, o.reason, self.repeated = self.trials + 1, f"its repeat failed: {reason}", \
                shape
            return
        o.status, o.reason, o.trial, o.wall = "failed", reason, self.trials + 1, wall

    def finish(self, why_stopped: str) -> None:
        """Label the shapes left untried: pruned against the final best, else why not
        tried."""
        best = self.best()
        near = {n for c in self.contenders() for n in self.grid.neighbours(c)}
        for o in self.outcomes.values():
            if o.status not in ("not tried", "pruned"):
                continue
            why = self._prune_reason(o.shape, self.measured()[best]) if best else None
            if why:
                o.status, o.reason = "pruned", why
            elif best is not None and o.shape not in near and o.shape not in self._opening:
                o.status, o.reason = "not tried", \
                    f"not next to the best shape or one within {self.noise:.0%} of it"
            else:
                o.status, o.reason = "not tried", why_stopped


def format_table(search: ShapeSearch, chosen: Optional[Shape]) -> str:
    lines = ["| trial | shape | ms per step | result |", "|---|---|---|---|"]
    rows = sorted(search.outcomes.values(),
                  key=lambda o: (o.trial is None, o.trial or 0, o.status == "not allowed",
                                 o.shape))
    for o in rows:
        ms = f"{o.seconds * 1e3:.2f}" if o.seconds is not None else "–"
        result = o.status + (f": {o.reason}" if o.reason else "")
        if len(o.runs) > 1:
            result += (" twice (the mean of " + " and ".join(f"{t * 1e3:.2f}" for t in o.runs)
                       + f": {search.noise:.0%} apart, the search's noise margin)")
        if o.shape == chosen:
            result += " ← chosen"
        trial = f"{o.trial}, {o.repeat}" if o.repeat else (o.trial or "–")
        lines.append(f"| {trial} | {o.shape.describe()} | {ms} | {result} |")
    return "\n".join(lines)


# -- the cache ---------------------------------------------------------------------------------

def signature(command: Sequence[str], workers: int, hosts: Sequence[Tuple[str, int]],
              launcher: str) -> str:
    """The job, whatever its shape: the command, the workers and where they run."""
    text = json.dumps(["shape", [os.path.basename(command[0])] + list(command[1:]), workers,
                       [list(h) for h in hosts], launcher])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def remembered(sig: str) -> Optional[Shape]:
    entry = tune.load_cache().get(sig)
    try:
        return Shape(**entry["shape"]) if entry else None
    except (KeyError, TypeError, ValueError):
        return None


# -- running trials ----------------------------------------------------------------------------

@dataclass
class TrialResult:
    rc: Optional[int]         # None: cut off at its timeout
    wall: float
    tail: List[str]
    enough: bool = False      # stopped once it had run enough steps


def run_trial(cmd: List[str], env: Dict[str, str], timeout: float, log_path: str,
              enough: Callable[[], bool] = lambda: False) -> TrialResult:
    """Run one trial's launcher in its own session, its output into ``log_path``; stop it
    once ``enough()`` says its steps are in, or cut it off at ``timeout``."""
    t0 = time.monotonic()
    rc, done = None, False
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while rc is None and time.monotonic() - t0 < max(1.0, timeout):
                try:
                    rc = proc.wait(timeout=POLL)
                except subprocess.TimeoutExpired:
                    done = enough()
                    if done:
                        break
            if rc is None:
                stop_session(proc)
        except BaseException:   # Ctrl-C or SIGTERM of the tuning: stop the trial's job too
            stop_session(proc)
            raise
    with open(log_path, errors="replace") as f:
        tail = f.read().splitlines()[-40:]
    return TrialResult(None if done else rc, time.monotonic() - t0, tail, done)


def stop_session(proc: subprocess.Popen, grace: float = STOP_GRACE) -> None:
    """SIGTERM to a launcher, which stops its job's scheduler, servers and mpiruns; SIGKILL
    to its whole session ``grace`` seconds later."""
    proc.terminate()
    try:
        proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def failure_reason(result: TrialResult, timeout: float) -> str:
    if result.rc is None:
        return f"cut off after {timeout:.0f} s (hung, or far slower than the others)"
    if result.rc in (-9, 137):
        return f"killed (exit code {result.rc}: out of memory?)"
    # the supervisor names the process that failed, and its last lines follow
    named = [i for i, line in enumerate(result.tail) if "; stopping the job" in line]
    if not named:
        return f"exit code {result.rc}"
    i = named[-1]
    who = result.tail[i].split("kvhybrid-launch: ")[-1].split("; stopping the job")[0]
    who = who.split(" on ")[0] + " " + who.split(") ", 1)[-1] if ") " in who else who
    lines = [line.strip() for line in result.tail[i + 1:] if line.startswith("    ")]
    # a rank's own last words, else the last line that is not mpirun's frame
    ranks = [line.split(">:", 1)[1] for line in lines if "]<std" in line and ">:" in line]
    last = [x for x in ranks if x.strip()] or [x for x in lines if x.strip("- ")]
    said = f" (last output: {last[-1].strip()[-120:]})" if last else ""
    return f"exit code {result.rc}: {who}{said}"


@dataclass
class Budget:
    """The tuning's own time: no trial starts that it cannot fit."""
    seconds: float
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self):
        if self.seconds <= 0:
            raise ValueError(f"--tune-budget must be > 0 seconds, got {self.seconds}")

    @property
    def used(self) -> float:
        return time.monotonic() - self.started

    @property
    def left(self) -> float:
        return self.seconds - self.used


def steps_written(stats_file: str) -> int:
    """The steps begun when rank 0 last wrote ``stats_file`` (0: not yet written)."""
    try:
        return int(json.loads(Path(stats_file).read_text()).get("steps", 0))
    except (OSError, ValueError):
        return 0


class Trials:
    """Starts trials of the job through the launcher and reads their step times."""

    def __init__(self, launcher_cmd: Callable[[Shape], List[str]], budget: Budget, tmp: str):
        self.launcher_cmd = launcher_cmd
        self.budget = budget
        self.tmp = tmp
        self.walls: List[float] = []   # successful trials' whole runs
        self.count = 0

    def expected(self) -> float:
        """How long the next trial should take: the slowest successful one so far."""
        return max(self.walls) if self.walls else 0.0

    def fits(self) -> bool:
        return self.budget.left > 0 and self.budget.used + self.expected() <= self.budget.seconds

    def timeout(self) -> float:
        """The next trial's cut-off: a few times the slowest trial, within what the budget
        leaves (never under ``MIN_TRIAL_TIMEOUT``: a trial that starts may finish)."""
        room = max(MIN_TRIAL_TIMEOUT, self.budget.left)
        if not self.walls:
            return room
        return min(room, max(MIN_TRIAL_TIMEOUT, TIMEOUT_FACTOR * self.expected()))

    def run(self, shape: Shape, env: Optional[Dict[str, str]] = None
            ) -> Tuple[Optional[dict], str, float]:
        """(rank 0's stats or None, why none, wall seconds) of one trial in ``shape``."""
        self.count += 1
        env = dict(env or {})
        stats = env.setdefault("KVHYBRID_STATS_FILE",
                               os.path.join(self.tmp, f"trial{self.count}.json"))
        steps = tune.WARMUP_STEPS + TRIAL_STEPS + 1
        env["KVHYBRID_STATS_STEPS"] = str(steps)
        full = {**os.environ, **env}
        timeout = self.timeout()
        result = run_trial(self.launcher_cmd(shape), full, timeout,
                           os.path.join(self.tmp, f"trial{self.count}.log"),
                           lambda: steps_written(stats) >= steps)
        if result.rc != 0 and not result.enough:
            return None, failure_reason(result, timeout), result.wall
        try:
            data = json.loads(Path(stats).read_text())
            data["seconds"] = tune.step_time_of(data)
        except ValueError as exc:   # (too few steps to drop the warm-up)
            return None, f"no steady step time: {exc}", result.wall
        except (OSError, KeyError) as exc:
            return None, f"no step times ({exc}): {tune.NO_STATS_HINT}", result.wall
        self.walls.append(result.wall)
        return data, "", result.wall


def search_shape(search: ShapeSearch, trials: Trials) -> Tuple[Optional[Shape], str]:
    """Run the search to its end: (the fastest shape measured, why the search stopped)."""
    why = "no untried shape could win"
    while True:
        shape = search.next()
        if shape is None:
            if search.trials >= search.max_trials:
                why = f"the trial cap ({search.max_trials})"
            break
        if not trials.fits():
            why = (f"the budget ({trials.budget.seconds:.0f} s; a trial takes about "
                   f"{trials.expected():.0f} s)")
            break
        n = search.trials + 1
        again = " again (how much its trials swing)" if shape in search.measured() else ""
        log.info("tune %d/%d: %s%s ...", n, search.max_trials, shape.describe(), again)
        stats, reason, wall = trials.run(shape)
        if stats is None:
            search.fail(shape, reason, wall)
            log.warning("tune %d: %s failed: %s; going on with the next shape", n,
                        shape.describe(), reason)
            continue
        seconds = stats["seconds"]
        search.record(shape, seconds, wall)
        if search.dense_only is None:
            search.dense_only = not stats.get("keys")
        log.info("tune %d: %s: %.2f ms per step (the trial took %.0f s, %s steps)", n,
                 shape.describe(), seconds * 1e3, wall, stats.get("steps", "?"))
    search.finish(why)
    return search.best(), why


def search_partitions(chosen: Shape, search: ShapeSearch, trials: Trials, hosts: int,
                      partition_sig: str, samples: int, out_dir: Optional[str]) -> str:
    """``tune.tune``'s partition search for the picked shape where it matters, within the
    budget left; says what was decided."""
    if not chosen.servers:
        return "partitions: not searched (the chosen shape has no servers)"
    if search.dense_only:
        return "partitions: not searched (dense-only model: no row_sparse keys in the trials)"
    per = trials.expected()
    room = int(trials.budget.left // per) if per else 0
    if min(samples, room) < 3:
        return (f"partitions: not searched (the budget left fits {room} trials; the fit "
                "needs 3)")

    def run_job(env: Dict[str, str]) -> int:
        stats, reason, _ = trials.run(chosen, env)
        if stats is None:
            log.warning("tune: the partition trial failed: %s", reason)
        return 0 if stats is not None else 1

    from kvhybrid.kvstore.ps.link import MAX_PARTITIONS  # imports MXNet: only when tuning
    start = tune.remembered(partition_sig) or min(chosen.servers, hosts)
    rc = tune.tune(run_job, partition_sig, start, MAX_PARTITIONS, min(samples, room), out_dir)
    if rc:
        return "partitions: the search stopped at a failed trial (the job runs at the default)"
    return f"partitions: searched, P = {tune.remembered(partition_sig)}"


def _search(grid: Grid, search: ShapeSearch, command_for, budget: Budget, partition_sig,
            samples: int, out_dir: Optional[str], tmp: str):
    """The shapes' trials, then the pick's partition search: (pick, why the search stopped,
    the shapes' seconds, what was decided about the model and its partitions)."""
    trials = Trials(command_for, budget, tmp)
    chosen, why = search_shape(search, trials)
    shape_seconds = budget.used
    if chosen is None:
        return None, why, shape_seconds, ""
    model = ("dense-only model (no row_sparse keys in the trials' stats)"
             if search.dense_only else "row_sparse keys found in the trials' stats")
    note = search_partitions(chosen, search, trials, grid.hosts, partition_sig(chosen), samples,
                             out_dir)
    return chosen, why, shape_seconds, f"{model}\n{note}"


def tune_shape(grid: Grid, sig: str, command_for: Callable[[Shape], List[str]],
               partition_sig: Callable[[Shape], str], budget_seconds: float, samples: int,
               out_dir: Optional[str] = None) -> Optional[Shape]:
    """Search, report, remember: the shape to run the job in, or None when no trial
    succeeded. ``command_for(shape)`` is the launcher's command for one trial."""
    budget = Budget(budget_seconds)
    start = remembered(sig)
    if start:
        log.info("tune: starting from this job's remembered shape, %s (%s)", start.describe(),
                 tune.cache_path())
    search = ShapeSearch(grid, start=start)
    # Ctrl-C and SIGTERM stop the running trial's job too (it runs in a session of its own)
    try:
        with signals_interrupt(), tune.trials_dir() as tmp:
            chosen, why, shape_seconds, note = _search(grid, search, command_for, budget,
                                                       partition_sig, samples, out_dir, tmp)
    except KeyboardInterrupt as exc:
        how = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        log.error("--tune %s: its trial stopped, nothing remembered", how)
        raise
    allowed = len(grid.allowed())
    head = (f"shape tuning: {grid.workers} workers on {grid.hosts} host(s); {search.trials} "
            f"trials of {allowed} allowed shapes; stopped: {why}; "
            f"{shape_seconds:.0f} s for the shapes, {budget.used:.0f} s in all, of the "
            f"{budget.seconds:.0f} s budget")
    pick = (f"chosen: {chosen.describe()} ({search.measured()[chosen] * 1e3:.2f} ms per step)"
            if chosen else "chosen: none (no trial ran to the end)")
    equals = search.equals(chosen) if chosen else []
    if equals:
        pick += (f"; within the trials' noise ({search.noise:.0%}) of it: "
                 + ", ".join(s.describe() for s in equals)
                 + " (a longer job of each tells them apart)")
    print("\n".join([head, format_table(search, chosen), pick, note]).rstrip(), flush=True)
    if chosen is None:
        return None
    tune.remember(sig, {
        "shape": asdict(chosen), "ms_per_step": search.measured()[chosen] * 1e3,
        "dense_only": bool(search.dense_only), "stopped": why, "partition_search": note,
        "trials": [{"shape": asdict(o.shape), "status": o.status, "reason": o.reason,
                    "trial": o.trial, "ms_per_step": o.seconds and o.seconds * 1e3,
                    "runs_ms": [t * 1e3 for t in o.runs], "repeat": o.repeat,
                    "wall_seconds": o.wall} for o in search.outcomes.values()],
        "trial_count": search.trials, "noise": search.noise,
        "seconds": budget.used, "shape_seconds": shape_seconds, "budget": budget.seconds,
        "when": time.strftime("%Y-%m-%d %H:%M:%S")})
    log.info("tune: remembered %s for this job in %s (plain runs of it start there)",
             chosen.describe(), tune.cache_path())
    return chosen
