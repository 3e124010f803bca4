"""One rank's reduce as a task a worker process runs (the local pool or a Ray worker): the trace is
named by its path or URL, the reduced files come back as bytes, so the driver writes them where
they belong and no worker needs the driver's disk. A failure comes back as one line, not a raise."""

from __future__ import annotations

import os
import resource
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bprof.errors import BprofError


@dataclass(frozen=True)
class ReduceTask:
    trace: str  # a local path or an fsspec URL, as the driver found it
    rank: int | None = None  # --rank, for a trace that does not record it
    threads: int | None = None  # DuckDB threads of the reduce (default: one per core of the worker)
    memory_limit: str = "600MB"  # DuckDB's buffer limit; past it, the reduce spills to the worker's temp dir


@dataclass
class TaskResult:
    trace: str
    rank: int | None = None
    files: dict[str, bytes] = field(default_factory=dict, repr=False)  # file name -> content of rank<R>.reduced/
    summary: dict | None = None  # ReduceResult.summary() of the reduce (its `out` is the worker's scratch)
    error: str | None = None  # one line naming the trace, when the reduce failed
    worker: str = ""  # host:pid of the process that ran it
    peak_rss_bytes: int = 0  # that process's peak resident memory so far (getrusage), DuckDB's included
    seconds: float = 0.0  # the task's wall time in the worker

    @property
    def ok(self) -> bool:
        return self.error is None


def run_task(task: ReduceTask) -> TaskResult:
    """Reduce one trace into a scratch directory and return its files (runs in a worker)."""
    from bprof.analyzers.reduce import reduce_trace  # the worker's import, not the driver's

    started = time.perf_counter()
    result = TaskResult(task.trace, rank=task.rank, worker=f"{socket.gethostname()}:{os.getpid()}")
    try:
        with tempfile.TemporaryDirectory(prefix="bprof-scale-") as tmp:
            reduced = reduce_trace(task.trace, Path(tmp) / "out.reduced", rank=task.rank, work_dir=Path(tmp),
                                   memory_limit=task.memory_limit, threads=task.threads)
            result.files = {p.name: p.read_bytes() for p in sorted(reduced.out.iterdir())}
            result.rank, result.summary = reduced.rank, reduced.summary()
    except BprofError as exc:
        result.error = naming(task.trace, str(exc))
    except Exception as exc:  # noqa: BLE001 - any other failure of one trace must not stop the others
        result.error = naming(task.trace, f"{type(exc).__name__}: {exc}")
    result.seconds = time.perf_counter() - started
    result.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return result


def naming(trace: str, message: str) -> str:
    """`message` as one line that starts with the trace (bprof's errors mostly name the file already)."""
    line = " ".join(message.strip().split("\n")[0].split()) or "failed"
    return line if line.startswith(trace) or line.startswith(str(Path(trace))) else f"{trace}: {line}"
