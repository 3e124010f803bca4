"""The launcher side of `bprof record --hang-timeout SECONDS` (no torch).

A thread beside the launched command reads the ranks' heartbeats (run/hang/heartbeat/, written by
hang_watch.py in every rank). When no rank has completed an optimizer step for the timeout (the
clock starts at the first completed step: imports, rendezvous and model set-up do not count, so a
job that hangs before its first step is left to its own timeouts), it asks every rank
for its Flight Recorder dump and stacks (run/hang/request), waits up to GATHER_S for them, takes
`py-spy dump` (where installed) or a faulthandler signal for ranks that did not answer, writes
run/hang/ranks.json (world size, group members, dead and unresponsive ranks), and ends the job:
SIGTERM to the command and every live rank, SIGKILL after STOP_GRACE_S. When the job fails by
itself, the ranks killed by a signal first (no Python exit: hang_watch's marker) are its dead ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

POLL_S = 0.1
GATHER_S = 10.0  # how long live ranks get to write their dumps
STOP_GRACE_S = 5.0  # between SIGTERM and SIGKILL
HANG_EXIT_CODE = 124  # `bprof record`'s exit code when it ended a hung job (as timeout(1))


class Watchdog(threading.Thread):
    def __init__(self, child: subprocess.Popen, run_dir: Path, timeout_s: float):
        super().__init__(name="bprof-hang-watchdog", daemon=True)
        self.child = child
        self.dir = run_dir / "hang"
        self.timeout_s = timeout_s
        self.fired = False
        self.idle_s = 0.0
        self.gone_at: dict[int, int] = {}  # rank -> the poll that first saw its process gone
        self.died: dict[int, str] = {}

    def run(self) -> None:
        (self.dir / "heartbeat").mkdir(parents=True, exist_ok=True)
        steps: dict[int, int] = {}
        last_progress = None
        polls = 0
        while self.child.poll() is None:
            time.sleep(POLL_S)
            polls += 1
            beats = read_heartbeats(self.dir)
            now = time.monotonic()
            for r, b in beats.items():
                if r not in self.gone_at and not _alive(b["pid"]):
                    self.gone_at[r] = polls
            progressed = any(b["step"] > steps.get(r, 0) for r, b in beats.items())  # step 0: not started
            steps = {r: max(b["step"], steps.get(r, 0)) for r, b in beats.items()}
            if progressed:
                last_progress = now
            if last_progress is not None and now - last_progress >= self.timeout_s and self.child.poll() is None:
                self.fired = True
                self.idle_s = now - last_progress
                self.gather()
                self.stop_job()
                return
        self.died = self._first_deaths(read_heartbeats(self.dir))

    def _first_deaths(self, beats: dict[int, dict]) -> dict[int, str]:
        """After a failed job: the ranks killed outright (gone with neither an exit marker nor a
        SIGTERM stack: hang_watch) that were gone first; torchrun stops the others after them with
        SIGTERM, which the same 0.1 s poll can see gone at once. Written to ranks.json for `bprof hang`."""
        if self.child.returncode in (0, None):
            return {}
        killed = {r: t for r, t in self.gone_at.items()
                  if not (self.dir / f"rank{r}.exit").exists() and not _nonempty(self.dir / f"rank{r}.sigterm.txt")}
        if not killed:
            return {}
        first = min(killed.values())
        dead = {r: f"killed by a signal (gone at poll {t}, every {POLL_S} s; the job exited {self.child.returncode})"
                for r, t in sorted(killed.items()) if t == first}
        world = max([b.get("world_size", 0) for b in beats.values()] + [0])
        (self.dir / "ranks.json").write_text(json.dumps(
            {"world_size": world, "dead": dead, "exit_code": self.child.returncode,
             "exited": sorted(int(p.name[4:].split(".")[0]) for p in self.dir.glob("rank*.exit"))}, indent=1))
        return dead

    def gather(self) -> None:
        (self.dir / "request.tmp").write_text(str(time.time_ns()))
        (self.dir / "request.tmp").replace(self.dir / "request")
        beats = read_heartbeats(self.dir)
        deadline = time.monotonic() + GATHER_S
        while time.monotonic() < deadline:
            waiting = [r for r, b in beats.items() if _alive(b["pid"]) and not (self.dir / f"rank{r}.done").exists()]
            if not waiting:
                break
            time.sleep(POLL_S)
        dead, unresponsive = {}, []
        for r, b in sorted(beats.items()):
            if not _alive(b["pid"]):
                dead[r] = "process gone before the hang was detected"
            elif not (self.dir / f"rank{r}.done").exists():
                unresponsive.append(r)
                self._native_stack(r, b["pid"])
        pg_ranks, pg_desc = {}, {}
        for f in sorted(self.dir.glob("rank*.groups.json")):
            try:
                g = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            pg_ranks.update(g.get("pg_ranks") or {})
            pg_desc.update({k: v for k, v in (g.get("pg_desc") or {}).items() if v})
        world = max([b.get("world_size", 0) for b in beats.values()] + [0])
        (self.dir / "ranks.json").write_text(json.dumps(
            {"world_size": world, "idle_s": round(self.idle_s, 3), "timeout_s": self.timeout_s,
             "pids": {r: b["pid"] for r, b in beats.items()}, "dead": dead, "unresponsive": unresponsive,
             "pg_ranks": pg_ranks, "pg_desc": pg_desc}, indent=1))

    def _native_stack(self, rank: int, pid: int) -> None:
        """A rank that did not answer (its GIL held, say): py-spy, else faulthandler's C-level signal.
        Written as rank<R>.native_stack.txt, which the verdict prefers to rank<R>.stack.txt: the signal
        can let the rank's own answer through late - once the job is being stopped, a CI run's answer
        showed the main thread in the script's SIGTERM handler, not where it hung."""
        out = self.dir / f"rank{rank}.native_stack.txt"
        if shutil.which("py-spy"):
            try:
                done = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
                if done.returncode == 0 and done.stdout.strip():
                    out.write_text(done.stdout)
                    return
            except (OSError, subprocess.TimeoutExpired):
                pass
        try:
            os.kill(pid, signal.SIGUSR2)  # hang_watch registered faulthandler for it
        except OSError:
            return
        time.sleep(1.0)
        fh = self.dir / f"rank{rank}.faulthandler.txt"
        if fh.exists() and fh.stat().st_size:
            shutil.copyfile(fh, out)

    def stop_job(self) -> None:
        pids = [b["pid"] for b in read_heartbeats(self.dir).values()]
        _signal_all(self.child, pids, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and (self.child.poll() is None or any(_alive(p) for p in pids)):
            time.sleep(POLL_S)
        _signal_all(self.child, pids, signal.SIGKILL)


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def read_heartbeats(hang_dir: Path) -> dict[int, dict]:
    beats = {}
    for f in (hang_dir / "heartbeat").glob("rank*.json"):
        try:
            b = json.loads(f.read_text())
            beats[int(b["rank"])] = b
        except (OSError, ValueError, KeyError):
            continue  # being replaced right now: read next time
    return beats


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


def _signal_all(child: subprocess.Popen, pids: list[int], sig: int) -> None:
    if child.poll() is None:
        try:
            child.send_signal(sig)
        except OSError:
            pass
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
