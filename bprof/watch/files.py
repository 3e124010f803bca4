"""The files `bprof record --watch` leaves in a run directory, and how to read them.

    watch/rank<R>[.restart<K>]/<first iteration>.steps.parquet    one row per rank and iteration
    watch/rank<R>[.restart<K>]/<first iteration>.groups.parquet   one row per iteration and process group
    watch/live.json                                               what the live analysis saw and did

Columns of steps (times are nanoseconds; *_ns of an iteration, from one optimizer step to the next):
    iteration     the iteration (0-based, as bprof counts them: the one that ended at end_ns)
    start_ns      wall clock (time.time_ns of the rank) when it started
    end_ns        wall clock when it ended (the next optimizer step's hook)
    step_ns       end_ns - start_ns
    busy_ns       CPU time of the training thread: compute and Python on a CPU rank, no wait for peers
    data_wait_ns  wall time in DataLoader iterators' __next__
    data_idle_ns  the part of data_wait_ns the training thread slept (waiting for loader workers)
    gc_ns         Python garbage-collector pauses
    blocked_ns    collectives called from Python: synchronous calls' time and async Work.wait() time;
                  on a CPU rank, also DDP's reducer's wait in backward (bprof.profiler.watch_rank)
    windowed      a trace window was open (its profiler's cost is in the row)
The Parquet schema's metadata key b"bprof_watch" holds {"rank", "host", "attempt"} as JSON.
Columns of groups: iteration, pg_name, pg_desc, blocked_ns, calls (pg "async"/"Work.wait" collects
the waits of async work, whose group the Work does not say).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

LIVE_FILE = "live.json"


@dataclass(frozen=True)
class RankFolder:
    rank: int
    attempt: int
    path: Path


def rank_folders(run_dir: Path) -> list[RankFolder]:
    """The watch folders of a run directory, by rank then attempt."""
    found = []
    for path in (Path(run_dir) / "watch").glob("rank*"):
        if not path.is_dir():
            continue
        name, _, restart = path.name[4:].partition(".restart")
        if not name.isdigit() or (restart and not restart.isdigit()):
            continue
        found.append(RankFolder(int(name), int(restart or 0), path))
    return sorted(found, key=lambda f: (f.rank, f.attempt))


def step_files(folder: Path) -> list[Path]:
    """A rank folder's complete step files, in iteration order (a .tmp is still being written)."""
    return sorted(folder.glob("*.steps.parquet"))


def read_steps(path: Path) -> tuple[dict, dict]:
    """One step file: (its columns as lists, its rank/host/attempt metadata)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = json.loads((table.schema.metadata or {}).get(b"bprof_watch", b"{}"))
    return table.to_pydict(), meta


def read_live(run_dir: Path) -> dict:
    """watch/live.json, or {} when the run has none."""
    try:
        return json.loads((Path(run_dir) / "watch" / LIVE_FILE).read_text())
    except (OSError, ValueError):
        return {}
