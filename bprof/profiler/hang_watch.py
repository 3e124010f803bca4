"""The rank side of `bprof record --hang-timeout`: a heartbeat per optimizer step, and, when the
launcher asks (run/hang/request), this rank's Flight Recorder dump and Python stacks.

Files under run/hang/ (the launcher side, hang_watchdog.py, reads them):
  heartbeat/rank<R>.json   {"rank", "pid", "world_size", "step", "time_ns"}, rewritten at most every
                           BEAT_INTERVAL_S (and at every step's first beat after that)
  rank<R>.fr.pkl           torch's Flight Recorder dump (the pickle `_dump_fr_trace()` returns)
  rank<R>.stack.txt        the main (training) thread first, then every thread, faulthandler's format
  rank<R>.groups.json      {"pg_ranks": {name: [ranks]}, "pg_desc": {name: desc}}: gloo's dump has no
                           pg_config, so the members of each group come from torch.distributed here
  rank<R>.done             written last: the launcher waits for it
  rank<R>.exit             written at a Python exit (atexit); absent for a rank killed by a signal
  rank<R>.sigterm.txt      every thread's stack, written from C when the rank receives SIGTERM after its
                           first step (then the signal goes on to the handler it had, so it ends the
                           rank as before, through the program's own SIGTERM handler if it has one):
                           a rank gone without .exit and without this was killed outright (SIGKILL, a
                           crash); one with it was stopped, by the launcher after a peer died, say
A daemon thread polls for the request, so a main thread blocked in Python or in a collective
that released the GIL still answers; SIGUSR2 makes faulthandler write all stacks from C
(rank<R>.faulthandler.txt) for a rank whose GIL is held.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

BEAT_INTERVAL_S = 0.2
POLL_S = 0.2

_watch = None


def install(run_dir: Path, rank: int) -> None:
    """Start the heartbeat and the request thread (once per process)."""
    global _watch
    if _watch is None:
        _watch = RankWatch(run_dir, rank)
        _watch.start()


class RankWatch:
    def __init__(self, run_dir: Path, rank: int):
        self.dir = run_dir / "hang"
        self.rank = rank
        self.step = 0
        self.last_beat = 0.0
        self._faulthandler_file = None
        self._sigterm_file = None

    def start(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        (self.dir / "heartbeat").mkdir(parents=True, exist_ok=True)
        self.beat(force=True)
        register_optimizer_step_post_hook(self._on_step)
        self._faulthandler_file = open(self.dir / f"rank{self.rank}.faulthandler.txt", "w")  # noqa: SIM115 - held for the process
        faulthandler.register(signal.SIGUSR2, file=self._faulthandler_file, all_threads=True)
        threading.Thread(target=self._serve, name="bprof-hang-watch", daemon=True).start()
        atexit.register(self._on_exit)

    def _mark_sigterm(self) -> None:
        """At the first step, when the program has set up its own SIGTERM handler if it has one (a
        handler set later replaces this one, and the launcher falls back to the order of deaths):
        faulthandler writes every stack from C, then chains to the handler the signal had."""
        try:
            self._sigterm_file = open(self.dir / f"rank{self.rank}.sigterm.txt", "w")  # noqa: SIM115 - held for the process
            faulthandler.register(signal.SIGTERM, file=self._sigterm_file, all_threads=True, chain=True)
        except (OSError, RuntimeError, ValueError):
            self._sigterm_file = False  # not again

    def _on_exit(self) -> None:
        """A rank that ends through Python (return, exception, sys.exit) says so; one killed by a
        signal cannot, which is how the launcher tells a rank that died from one that stopped."""
        try:
            _write_json(self.dir / f"rank{self.rank}.exit", {"time_ns": time.time_ns(), "step": self.step})
        except OSError:
            pass

    def _on_step(self, optimizer, args, kwargs) -> None:
        self.step += 1  # several optimizers per iteration beat more often: progress is what counts
        if self._sigterm_file is None:
            self._mark_sigterm()
        self.beat()

    def beat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_beat < BEAT_INTERVAL_S:
            return
        self.last_beat = now
        _write_json(self.dir / "heartbeat" / f"rank{self.rank}.json",
                    {"rank": self.rank, "pid": os.getpid(), "world_size": int(os.environ.get("WORLD_SIZE", "1")),
                     "step": self.step, "time_ns": time.time_ns()})

    def _serve(self) -> None:
        request = self.dir / "request"
        while not request.exists():
            time.sleep(POLL_S)
        self.beat(force=True)
        self.dump()

    def dump(self) -> None:
        """This rank's Flight Recorder dump, stacks and groups; each part on its own, so one failing
        leaves the others."""
        problems = []
        try:
            import torch

            (self.dir / f"rank{self.rank}.fr.pkl").write_bytes(torch._C._distributed_c10d._dump_fr_trace())
        except Exception as exc:  # Flight Recorder off, or no process group
            problems.append(f"Flight Recorder: {type(exc).__name__}: {exc}")
        try:
            (self.dir / f"rank{self.rank}.stack.txt").write_text(stacks_text())
        except Exception as exc:
            problems.append(f"stacks: {type(exc).__name__}: {exc}")
        try:
            _write_json(self.dir / f"rank{self.rank}.groups.json", process_groups())
        except Exception as exc:
            problems.append(f"groups: {type(exc).__name__}: {exc}")
        _write_json(self.dir / f"rank{self.rank}.done", {"problems": problems})


def stacks_text() -> str:
    """The main thread's stack, labelled MainThread, then every Python thread (faulthandler's format)."""
    main = threading.main_thread()
    frame = sys._current_frames().get(main.ident)
    lines = [f"Thread 0x{main.ident:016x} MainThread (most recent call first):"]
    if frame is not None:
        lines += [f'  File "{fs.filename}", line {fs.lineno} in {fs.name}'
                  for fs in reversed(traceback.extract_stack(frame))]
    lines.append("")
    import tempfile

    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        lines.append("All threads:")
        lines.append(f.read())
    return "\n".join(lines)


def process_groups() -> dict:
    """Members and description of every process group this rank knows (by torch's group name)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return {"pg_ranks": {}, "pg_desc": {}}
    c10d = dist.distributed_c10d
    pg_ranks, pg_desc = {}, {}
    for pg, name in list(c10d._world.pg_names.items()):
        try:
            pg_ranks[name] = list(c10d.get_process_group_ranks(pg))
        except Exception:
            continue
        pg_desc[name] = getattr(pg, "group_desc", "") or ("default_pg" if pg is c10d.GroupMember.WORLD else "")
    return {"pg_ranks": pg_ranks, "pg_desc": pg_desc}


def _write_json(path: Path, value) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)
