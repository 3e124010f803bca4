"""The live analysis of `bprof record --watch`, in the record process beside the launcher.

It reads the ranks' watch files as they appear (bprof.watch.files), and for every iteration all
ranks have reported it compares each rank's own time with its peers':

    own_ns   = busy_ns + data_idle_ns   (what the rank spent itself: compute, Python, waiting for
                                         data; not waiting for its peers)
    ratio    = own_ns / the median own_ns of the other ranks in that iteration
    excess   = own_ns - that median

A rank's score is the median ratio over its last `window` iterations (windowed iterations, whose
profiler inflates every rank, and the first `warmup` are left out). Peers are all ranks of the job:
the watch files do not say a rank's pipeline stage, so a pipeline job's stages, whose own times
differ by design, are compared with each other (a known limit; see docs/watch.md).

Two rules open a trace window on every rank (the trigger file of SIGUSR1, naming the iteration):
  - a rank: its ratio is above `score_limit` and its excess above `min_excess_frac` of the job's
    median step for `consecutive` iterations running;
  - the job: its step (the longest rank's) is above `step_factor` x the rolling median step of the
    iterations before for `step_consecutive` iterations running.
Each episode (a rank slow, or the job slow, until it is not for `window` iterations) opens one
window at most, and at most `max_windows_per_hour` open in any hour.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bprof.watch import files


@dataclass(frozen=True)
class WatchOptions:
    window: int = 5  # iterations a rank's score takes the median over
    warmup: int = 10  # first iterations left out of every baseline
    history: int = 50  # iterations of the job's rolling median step
    score_limit: float = 1.3
    min_excess_frac: float = 0.10  # of the job's median step
    step_factor: float = 2.0
    consecutive: int = 5  # iterations running a rank must meet the rank rule (a clean 4-rank job on a loaded
    # 2-core CI host had one rank at 1.69x its peers' own time for 3 running: 3 opened a window there)
    step_consecutive: int = 5  # ... and the step the step rule (a load burst on a shared host lasts a few)
    window_steps: int = 3  # iterations a triggered window captures
    max_windows_per_hour: int = 4
    trigger: bool = True
    flush_every: int = 10  # the ranks' rows per file (BPROF_WATCH_FLUSH_EVERY): how far they may be ahead
    poll_s: float = 0.2  # how often the record process reads the watch files
    model_flops_per_step: float | None = None  # --model-flops; else what the ranks declare


@dataclass
class RankScore:
    rank: int
    host: str
    iteration: int  # the newest iteration it is scored at
    own_ns: float  # median over the score's iterations
    peers_own_ns: float
    excess_ns: float
    score: float
    slow_run: int = 0  # consecutive iterations meeting the rank rule


@dataclass
class Trigger:
    seen_at: int  # newest iteration every rank had reported
    start: int  # the window's first iteration
    steps: int
    rule: str  # "rank" or "step"
    rank: int | None
    reason: str
    time_ns: int


@dataclass
class Episode:
    rule: str
    rank: int | None
    first_iteration: int
    last_iteration: int
    worst_score: float
    triggered: bool = False


@dataclass
class LiveState:
    """What the live analysis knows now; `snapshot()` is what the metrics endpoint serves."""

    newest_complete: int = -1
    ranks: dict[int, RankScore] = field(default_factory=dict)
    steps_ns: deque = field(default_factory=lambda: deque(maxlen=200))  # (iteration, job step) of complete iterations
    triggers: list[Trigger] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    hosts: dict[int, str] = field(default_factory=dict)
    rank_steps_ns: dict[int, deque] = field(default_factory=dict)  # rank -> its last 200 step_ns
    totals: dict[int, dict[str, int]] = field(default_factory=dict)  # rank -> data_wait/gc/blocked ns summed
    group_blocked_ns: dict[tuple[int, str, str], int] = field(default_factory=dict)  # (rank, pg, desc) -> ns


class LiveWatch:
    """Poll a run directory's watch files; score ranks; write the trigger file when a rule fires."""

    def __init__(self, run_dir: Path, options: WatchOptions = WatchOptions()):
        self.run_dir = Path(run_dir)
        self.options = options
        self.state = LiveState()
        self.rows: dict[int, dict[int, dict]] = {}  # rank -> iteration -> row (the current attempt's)
        self.seen_files: set[Path] = set()
        self.read_mtime_ns: dict[Path, int] = {}  # a rank folder's mtime when all of it was read
        self.attempt: dict[int, int] = {}
        self.own: dict[int, deque] = {}  # rank -> (ratio, excess, own, peers) of its last scored iterations
        self.open_episodes: dict[tuple[str, int | None], Episode] = {}
        self.quiet_for: dict[tuple[str, int | None], int] = {}
        self.step_run = 0
        self.lock = threading.Lock()  # poll() runs in the record process's watch thread, snapshot() at scrapes
        self.run_name = self.run_dir.name
        self.meta: dict[int, dict] = {}  # rank -> its newest steps file's metadata

    # -- reading ---------------------------------------------------------------------------
    def poll(self) -> list[str]:
        """Read new files and score the iterations they complete; returns the lines it said."""
        with self.lock:
            return self._poll()

    def _poll(self) -> list[str]:
        for folder in files.rank_folders(self.run_dir):
            if folder.attempt < self.attempt.get(folder.rank, 0):
                continue
            try:
                mtime_ns = folder.path.stat().st_mtime_ns
            except OSError:
                continue
            # a file is published by a rename into the folder, which changes its mtime: an unchanged
            # folder has nothing new (re-listing thousands of files every poll cost 37 ms of CPU at
            # 1,000 files a rank); a folder changed within the last second is listed again all the
            # same, for file systems whose mtime is coarser than the renames
            if self.read_mtime_ns.get(folder.path) == mtime_ns and time.time_ns() - mtime_ns > 1e9:
                continue
            if folder.attempt > self.attempt.get(folder.rank, 0):  # a restart: the old attempt's rows go
                self.attempt[folder.rank] = folder.attempt
                self.rows[folder.rank] = {}
            complete = True
            for path in files.step_files(folder.path):
                if path in self.seen_files:
                    continue
                self.seen_files.add(path)
                try:
                    columns, meta = files.read_steps(path)
                except Exception:  # a file being replaced, or damaged: the next poll sees it again or never
                    self.seen_files.discard(path)
                    complete = False
                    continue
                self.add_rows(folder.rank, columns, meta.get("host", ""))
                self.meta[folder.rank] = meta
            if self._read_groups(folder) and complete:
                self.read_mtime_ns[folder.path] = mtime_ns
        return self.score()

    def _read_groups(self, folder: files.RankFolder) -> bool:
        """Add the folder's new groups files; False when one could not be read (the next poll retries)."""
        import pyarrow.parquet as pq
        complete = True
        for path in sorted(folder.path.glob("*.groups.parquet")):
            if path in self.seen_files:
                continue
            self.seen_files.add(path)
            try:
                table = pq.read_table(path).to_pydict()
            except Exception:
                self.seen_files.discard(path)
                complete = False
                continue
            for name, desc, ns in zip(table["pg_name"], table["pg_desc"], table["blocked_ns"]):
                key = (folder.rank, name, desc)
                self.state.group_blocked_ns[key] = self.state.group_blocked_ns.get(key, 0) + ns
        return complete

    def add_rows(self, rank: int, columns: dict, host: str = "") -> None:
        """Rows of one rank (the columns of a steps file)."""
        mine = self.rows.setdefault(rank, {})
        self.state.hosts[rank] = host
        totals = self.state.totals.setdefault(rank, {"data_wait_ns": 0, "gc_ns": 0, "blocked_ns": 0, "steps": 0})
        names = list(columns)
        for values in zip(*columns.values()):
            row = dict(zip(names, values))
            mine[row["iteration"]] = row
            self.state.rank_steps_ns.setdefault(rank, deque(maxlen=200)).append(row["step_ns"])
            for key in ("data_wait_ns", "gc_ns", "blocked_ns"):
                totals[key] += row[key]
            totals["steps"] += 1

    # -- scoring ---------------------------------------------------------------------------
    def score(self) -> list[str]:
        said = []
        ranks = sorted(self.rows)
        if len(ranks) < 2:
            return said
        complete = min(max(self.rows[r], default=-1) for r in ranks)
        for iteration in range(self.state.newest_complete + 1, complete + 1):
            rows = [self.rows[r].get(iteration) for r in ranks]
            if any(row is None for row in rows):
                continue
            said += self._score_iteration(iteration, dict(zip(ranks, rows)))
        self.state.newest_complete = max(self.state.newest_complete, complete)
        for rank in ranks:  # rows already scored are not needed again
            for old in [i for i in self.rows[rank] if i <= complete - self.options.history]:
                del self.rows[rank][old]
        return said

    def _score_iteration(self, iteration: int, rows: dict[int, dict]) -> list[str]:
        opt, said = self.options, []
        if iteration < opt.warmup or any(row["windowed"] for row in rows.values()):
            return said
        job_step = max(row["step_ns"] for row in rows.values())
        earlier = [ns for _, ns in list(self.state.steps_ns)[-opt.history:]]
        own = {r: row["busy_ns"] + row["data_idle_ns"] for r, row in rows.items()}
        for rank, mine in own.items():
            peers = statistics.median(v for r, v in own.items() if r != rank)
            q = self.own.setdefault(rank, deque(maxlen=opt.window))
            q.append((mine / peers if peers > 0 else float("inf"), mine - peers, mine, peers))
            ratio = statistics.median(x[0] for x in q)
            score = self.state.ranks.get(rank) or RankScore(rank, self.state.hosts.get(rank, ""), iteration,
                                                            0, 0, 0, 0)
            score.iteration, score.score = iteration, ratio
            score.own_ns = statistics.median(x[2] for x in q)
            score.peers_own_ns = statistics.median(x[3] for x in q)
            score.excess_ns = statistics.median(x[1] for x in q)
            median_step = statistics.median(earlier) if earlier else job_step
            this_ratio, this_excess = q[-1][0], q[-1][1]
            slow = this_ratio > opt.score_limit and this_excess > opt.min_excess_frac * median_step
            score.slow_run = score.slow_run + 1 if slow else 0
            self.state.ranks[rank] = score
            said += self._episode("rank", rank, iteration, slow, score.slow_run, score.score,
                                  lambda s=score, m=median_step: (
                                      f"rank {s.rank}{_on(s.host)} spends {s.own_ns / 1e6:.1f} ms of its own a step "
                                      f"against its peers' {s.peers_own_ns / 1e6:.1f} ms ({s.score:.2f}x, "
                                      f"+{s.excess_ns / 1e6:.1f} ms on a {m / 1e6:.1f} ms step) for "
                                      f"{s.slow_run} iterations"))
        slow = False
        if len(earlier) >= opt.step_consecutive:
            median_step = statistics.median(earlier)
            slow = job_step > opt.step_factor * median_step
            self.step_run = self.step_run + 1 if slow else 0
            said += self._episode("step", None, iteration, slow, self.step_run, job_step / median_step,
                                  lambda m=median_step: (
                                      f"the step took {job_step / 1e6:.1f} ms, {job_step / m:.2f}x the rolling median "
                                      f"{m / 1e6:.1f} ms, for {self.step_run} iterations{self._slowest()}"))
        # the rolling median leaves out slow steps (it would learn them), until they last `history` iterations:
        # then they are the job's new pace
        if not slow or self.step_run >= opt.history:
            self.state.steps_ns.append((iteration, job_step))
        return said

    def _slowest(self) -> str:
        """The rank whose score is highest, when above the limit: what the step rule's reason adds."""
        top = max(self.state.ranks.values(), key=lambda s: s.score, default=None)
        if top is None or top.score <= self.options.score_limit:
            return ""
        return (f"; rank {top.rank}{_on(top.host)} spends {top.score:.2f}x its peers' own time "
                f"(+{top.excess_ns / 1e6:.1f} ms a step)")

    def _episode(self, rule: str, rank: int | None, iteration: int, slow: bool, run: int, score: float,
                 reason) -> list[str]:
        key, said = (rule, rank), []
        episode = self.open_episodes.get(key)
        needed = self.options.consecutive if rule == "rank" else self.options.step_consecutive
        if slow:
            self.quiet_for[key] = 0
            if episode is None and run >= needed:
                episode = Episode(rule, rank, iteration - run + 1, iteration, score)
                self.open_episodes[key] = episode
                self.state.episodes.append(episode)
                said.append(f"bprof watch: iteration {iteration}: {reason()}")
                if self._may_trigger(iteration):
                    trigger = self._trigger(iteration, rule, rank, reason())
                    episode.triggered = True
                    said.append(f"bprof watch: opening a trace window {trigger.start}:{trigger.start + trigger.steps}"
                                f" on every rank")
            elif episode is not None:
                episode.last_iteration, episode.worst_score = iteration, max(episode.worst_score, score)
        elif episode is not None:
            self.quiet_for[key] = self.quiet_for.get(key, 0) + 1
            if self.quiet_for[key] >= self.options.window:
                del self.open_episodes[key]
                who = f"rank {rank}" if rank is not None else "the step"
                said.append(f"bprof watch: iteration {iteration}: {who} is back to normal (slow over iterations "
                            f"{episode.first_iteration}-{episode.last_iteration})")
        return said

    def _may_trigger(self, iteration: int) -> bool:
        if not self.options.trigger:
            return False
        now = time.time_ns()
        recent = [t for t in self.state.triggers if now - t.time_ns < 3600e9]
        if len(recent) >= self.options.max_windows_per_hour:
            return False
        # one window at a time: the last one must have been captured (it started and ended) already
        return not self.state.triggers or self.state.triggers[-1].start + self.state.triggers[-1].steps <= iteration

    def _trigger(self, iteration: int, rule: str, rank: int | None, reason: str) -> Trigger:
        trigger = Trigger(iteration, self.window_start(), self.options.window_steps, rule, rank, reason,
                          time.time_ns())
        self.state.triggers.append(trigger)
        tmp = self.run_dir / "trigger.tmp"
        tmp.write_text(json.dumps({"start": trigger.start, "steps": trigger.steps, "reason": reason}))
        tmp.replace(self.run_dir / "trigger")
        self.save()
        return trigger

    def window_start(self) -> int:
        """Where a window asked for now starts: beyond any iteration a rank may have reached before it
        reads the trigger file (rows not yet flushed, and those of one poll interval), plus two."""
        seen = max(max(rows, default=0) for rows in self.rows.values())
        steps = [ns for _, ns in self.state.steps_ns]
        step_ns = statistics.median(steps[-self.options.history:]) if steps else 1e9
        return seen + self.options.flush_every + math.ceil(self.options.poll_s * 1e9 / max(step_ns, 1)) + 2

    # -- what it keeps -----------------------------------------------------------------------
    def save(self) -> None:
        """watch/live.json: the triggers, the episodes and the last scores (ingest reads it)."""
        folder = self.run_dir / "watch"
        folder.mkdir(parents=True, exist_ok=True)
        data = {"options": asdict(self.options), "newest_complete_iteration": self.state.newest_complete,
                "triggers": [asdict(t) for t in self.state.triggers],
                "episodes": [asdict(e) for e in self.state.episodes],
                "scores": [asdict(s) for s in sorted(self.state.ranks.values(), key=lambda s: s.rank)]}
        tmp = folder / (files.LIVE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(folder / files.LIVE_FILE)

    def snapshot(self):
        """The metrics endpoint's view of now (bprof.watch.metrics)."""
        from bprof.watch.metrics import RankMetrics, Snapshot

        with self.lock:
            state = self.state
            ranks = [RankMetrics(rank, state.hosts.get(rank, ""), list(state.rank_steps_ns.get(rank, ())),
                                 state.ranks[rank].own_ns if rank in state.ranks else None,
                                 state.ranks[rank].score if rank in state.ranks else None,
                                 state.totals.get(rank, {}).get("data_wait_ns", 0),
                                 state.totals.get(rank, {}).get("gc_ns", 0)) for rank in sorted(self.rows)]
            steps = [ns for _, ns in state.steps_ns]
            declared = self.options.model_flops_per_step or next(
                (m["model_flops_per_step"] for m in self.meta.values() if m.get("model_flops_per_step")), None)
            return Snapshot(self.run_name, state.newest_complete, ranks, dict(state.group_blocked_ns),
                            len(state.triggers), declared, statistics.median(steps) if steps else None,
                            _peak_sum(self.meta))

    def status_line(self) -> str | None:
        """One line: the newest iteration, the job's median step, the rank with the highest score."""
        if not self.state.ranks or not self.state.steps_ns:
            return None
        median_ms = statistics.median(ns for _, ns in self.state.steps_ns) / 1e6
        top = max(self.state.ranks.values(), key=lambda s: s.score)
        return (f"bprof watch: iteration {self.state.newest_complete}: median step {median_ms:.1f} ms over "
                f"{len(self.state.steps_ns)} iterations; highest score rank {top.rank}{_on(top.host)} {top.score:.2f}x "
                f"({top.excess_ns / 1e6:+.1f} ms a step over its peers)")


def _peak_sum(meta: dict[int, dict]) -> float | None:
    """The ranks' dense bf16 datasheet peaks summed (the MFU denominator, as bprof analyze takes it);
    None unless every rank is a device bprof's table knows."""
    from bprof.kernels.devices import resolve_device

    total = 0.0
    for m in meta.values():
        peaks = resolve_device(m["device_properties"]) if m.get("device_properties") else None
        if peaks is None or "bf16" not in peaks.flops_per_s:
            return None
        total += peaks.flops_per_s["bf16"]
    return total or None


def _on(host: str) -> str:
    return f" on {host}" if host else ""
