"""`bprof record -- CMD...`: run any launcher with bprof injected into every worker process.

The launcher never imports torch. It puts profiler/inject first on PYTHONPATH (its
sitecustomize chain-loads any other) and passes the capture settings in BPROF_* variables, which
torchrun, deepspeed, accelerate and dlrover-run hand on to their workers unchanged. It enables
PyTorch's Flight Recorder (TORCH_FR_BUFFER_SIZE) so that gloo collectives get their process
group and sequence number, forwards signals to the child, and returns the child's exit code.
SIGUSR1 asks every rank for an on-demand window (the trigger file in the run directory).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bprof.errors import UsageError
from bprof.profiler.windows import DEFAULT_WINDOWS, parse_windows

INJECT_DIR = Path(__file__).resolve().parent / "inject"
FLIGHT_RECORDER_ENTRIES = "20000"
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@dataclass(frozen=True)
class RecordOptions:
    command: tuple[str, ...]
    out: Path | None = None  # default: bprof_runs/<run id>
    name: str | None = None
    steps: str = DEFAULT_WINDOWS
    memory: bool = False
    execution_trace: bool = False
    model_flops: float | None = None
    reduce: bool = False  # each rank runs `bprof reduce` on each window's trace (rank<R>.reduced beside it)
    trigger_steps: int = 3  # steps an on-demand (SIGUSR1) window captures
    hang_timeout_s: float | None = None  # end the job, with dumps and a verdict, after so long without a step
    watch: object | None = None  # a bprof.watch.live.WatchOptions: per-iteration telemetry, live scores, triggers
    metrics_port: int | None = None  # --watch: serve Prometheus metrics there (0: any free port)
    metrics_addr: str = "0.0.0.0"
    extra_env: dict = field(default_factory=dict)


@dataclass
class RecordResult:
    run_id: str
    run_dir: Path
    exit_code: int
    ranks_with_traces: list[int]
    windows: list[str]
    hung: bool = False  # --hang-timeout ended the job; its dumps are in run_dir/hang
    dead_ranks: list[int] = field(default_factory=list)  # --hang-timeout: ranks killed by a signal first
    watch: dict = field(default_factory=dict)  # --watch: watch/live.json (triggers, episodes, scores)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def record(options: RecordOptions) -> RecordResult:
    """Run the command to completion under capture; the caller ingests the run directory."""
    if not options.command:
        raise UsageError("nothing to run: give the launcher command after --, e.g. bprof record -- torchrun ... train.py")
    parse_windows(options.steps)  # a bad --steps fails here, not inside every rank
    run_id = new_run_id()
    run_dir = Path(options.out or Path("bprof_runs") / (options.name or run_id)).resolve()
    if (run_dir / "traces").exists() and any((run_dir / "traces").iterdir()):
        raise UsageError(f"{run_dir} already holds a recording; pick another --out or --name")
    (run_dir / "traces").mkdir(parents=True, exist_ok=True)
    (run_dir / "meta").mkdir(parents=True, exist_ok=True)
    env = _child_env(options, run_id, run_dir)
    (run_dir / "meta" / "launch.json").write_text(json.dumps(
        {"run_id": run_id, "name": options.name, "command": list(options.command), "steps": options.steps,
         "started_ns": time.time_ns(), "cwd": os.getcwd()}, indent=1))
    watching = None
    if options.watch is not None:  # first: a metrics port already taken fails before the job starts
        from bprof.watch.runner import WatchThread

        watching = WatchThread(run_dir, options.watch, options.metrics_port, options.metrics_addr, options.model_flops)
        try:
            watching.start()
        except OSError as exc:
            raise UsageError(f"--metrics-port {options.metrics_port}: cannot serve metrics there: {exc}") from None
    try:
        child = subprocess.Popen(list(options.command), env=env)
    except FileNotFoundError:
        if watching is not None:
            watching.stop()
        raise UsageError(f"cannot run {options.command[0]!r}: no such program") from None
    previous = {sig: signal.signal(sig, lambda s, _f: _forward(child, s)) for sig in _FORWARDED}
    previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, lambda s, _f: _trigger(run_dir, options.trigger_steps))
    watchdog = None
    if options.hang_timeout_s:
        from bprof.profiler.hang_watchdog import Watchdog

        watchdog = Watchdog(child, run_dir, options.hang_timeout_s)
        watchdog.start()
    try:
        exit_code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    ranks = sorted({int(p.name[4:].split(".")[0]) for p in (run_dir / "traces").glob("iteration_*/rank*.json.gz")})
    windows = sorted(p.name for p in (run_dir / "traces").glob("iteration_*") if any(p.iterdir()))
    launch = json.loads((run_dir / "meta" / "launch.json").read_text())
    if watchdog is not None:
        watchdog.join(timeout=30)
    hung = watchdog is not None and watchdog.fired
    watched = watching.stop() if watching is not None else {}
    dead = sorted(watchdog.died) if watchdog is not None else []
    if hung:
        from bprof.profiler.hang_watchdog import HANG_EXIT_CODE

        exit_code = HANG_EXIT_CODE
    launch.update({"exit_code": exit_code, "ended_ns": time.time_ns()})
    (run_dir / "meta" / "launch.json").write_text(json.dumps(launch, indent=1))
    return RecordResult(run_id, run_dir, exit_code, ranks, windows, hung, dead, watched)


def _child_env(options: RecordOptions, run_id: str, run_dir: Path) -> dict:
    env = dict(os.environ)
    path = [str(INJECT_DIR), str(Path(__file__).resolve().parents[2])]  # the hook, and bprof itself
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env.update({
        "PYTHONPATH": os.pathsep.join(path),
        "BPROF_RUN_DIR": str(run_dir),
        "BPROF_RUN_ID": run_id,
        "BPROF_STEPS": options.steps,
        "BPROF_OPTIONS": json.dumps({"memory": options.memory, "execution_trace": options.execution_trace,
                                     "model_flops": options.model_flops, "reduce": options.reduce}),
        "BPROF_COMMAND": json.dumps(list(options.command)),
        "BPROF_GIT_SHA": _git("rev-parse", "HEAD"),
        "BPROF_GIT_BRANCH": _git_branch(),
    })
    env.setdefault("TORCH_FR_BUFFER_SIZE", FLIGHT_RECORDER_ENTRIES)
    if options.hang_timeout_s:
        env["BPROF_HANG_TIMEOUT_S"] = str(options.hang_timeout_s)
    if options.watch is not None:
        env["BPROF_WATCH"] = "1"
        env["BPROF_WATCH_FLUSH_EVERY"] = str(options.watch.flush_every)
    env.setdefault("BPROF_PYTHON", sys.executable)  # runs the ranks' `bprof reduce`: bprof's own interpreter
    env.update(options.extra_env)
    return env


def _forward(child: subprocess.Popen, sig: int) -> None:
    if child.poll() is None:
        child.send_signal(sig)


def _trigger(run_dir: Path, num_steps: int) -> None:
    """Every rank checks this file once per iteration and captures the next num_steps."""
    tmp = run_dir / "trigger.tmp"
    tmp.write_text(str(num_steps))
    tmp.replace(run_dir / "trigger")


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _git_branch() -> str:
    """The checked-out branch; a detached checkout (CI) says HEAD, then GitHub Actions' variables name it."""
    branch = _git("rev-parse", "--abbrev-ref", "HEAD")
    if branch == "HEAD":
        return os.environ.get("GITHUB_HEAD_REF") or os.environ.get("GITHUB_REF_NAME") or ""
    return branch
