"""Reduce many rank traces at once and ingest the outputs: `bprof reduce PATH... --engine E` and
`bprof ingest PATH... --engine E`.

The driver plans the runs (sources.plan), keeps the outputs already complete (outputs.Existing),
hands the rest to the engine as one task per trace, and writes each result as it arrives, so that
one failed trace costs only itself: the others' outputs are written and, for ingest, loaded as a
run (a partial one, which ingest says), and a rerun reduces only what is still missing."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import duckdb

from bprof.errors import UsageError
from bprof.scale.engines import check_engine, run_tasks
from bprof.scale.outputs import Existing, target, write_output
from bprof.scale.sources import Job, PlannedRun, plan, run_files
from bprof.scale.tasks import ReduceTask, TaskResult
from bprof.store.ingest import IngestOptions, IngestResult, ingest_reduced_run
from bprof.store.kineto_file import trace_path


@dataclass(frozen=True)
class FanoutOptions:
    engine: str = "local"  # local | ray (bprof.scale.engines)
    address: str | None = None  # a Ray cluster (ray start --head prints it); None: RAY_ADDRESS or a local Ray
    workers: int | None = None  # reduces at once (default: every CPU the engine has)
    out: str | None = None  # folder (local or URL) under which the outputs go; None: beside each trace
    rank: int | None = None  # for a single trace that does not record its rank
    threads: int | None = None  # DuckDB threads per reduce
    memory_limit: str = "600MB"
    force: bool = False  # reduce again even where a complete output exists


@dataclass
class Outcome:
    """What became of one trace."""

    trace: str
    status: str  # reduced | kept (a complete output was there) | failed
    out: str | None = None
    rank: int | None = None
    error: str | None = None
    result: TaskResult | None = field(default=None, repr=False)

    def summary(self) -> dict:
        extra = {}
        if self.result is not None:
            extra = {"seconds": self.result.seconds, "worker": self.result.worker,
                     "peak_rss_bytes": self.result.peak_rss_bytes, "reduce": {**(self.result.summary or {}), "out": self.out}}
        return {"trace": self.trace, "status": self.status, "out": self.out, "rank": self.rank, "error": self.error, **extra}


@dataclass
class Fanout:
    runs: list[PlannedRun]
    outcomes: dict[str, Outcome]  # by trace, in the order of the runs' jobs

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes.values() if o.status == "failed"]

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes.values())


Progress = Callable[[int, int], None]  # (traces done, traces total)


def reduce_paths(paths: list[str], options: FanoutOptions = FanoutOptions(), progress: Progress | None = None) -> Fanout:
    """Reduce every trace under `paths` that has no complete output yet."""
    check_engine(options.engine, options.workers, options.address)
    runs = plan([str(p) for p in paths], options.out)
    jobs = [j for run in runs for j in run.jobs]
    if options.rank is not None and len(jobs) != 1:
        raise UsageError("--rank applies to a single trace file only")
    existing, outcomes, todo = Existing(), {}, {}
    for job in jobs:
        found = None if options.force else existing.find(job)
        if found is not None:
            outcomes[job.trace] = Outcome(job.trace, "kept", str(found))
        else:
            outcomes[job.trace] = Outcome(job.trace, "failed", error=f"{job.trace}: not reduced")  # until its result comes
            todo[job.trace] = job
    tasks = [ReduceTask(t, rank=options.rank, threads=options.threads, memory_limit=options.memory_limit) for t in todo]
    written: dict[str, str] = {}  # output -> the trace written there in this call
    done = len(jobs) - len(todo)
    if progress:
        progress(done, len(jobs))
    for result in run_tasks(tasks, options.engine, workers=options.workers, address=options.address):
        outcomes[result.trace] = _place(todo[result.trace], result, written)
        done += 1
        if progress:
            progress(done, len(jobs))
    return Fanout(runs, outcomes)


def _place(job: Job, result: TaskResult, written: dict[str, str]) -> Outcome:
    """Write a finished task's output where it belongs (a failed one: its error, nothing written)."""
    if not result.ok:
        return Outcome(job.trace, "failed", error=result.error, result=result)
    out = target(job, result.rank)
    if str(out) in written:
        return Outcome(job.trace, "failed", rank=result.rank, result=result,
                       error=f"{job.trace}: rank {result.rank} again: {written[str(out)]} was reduced into {out} already "
                             "(give the runs separately, or --out per run)")
    try:
        write_output(result.files, out)
    except OSError as exc:
        return Outcome(job.trace, "failed", rank=result.rank, result=result,
                       error=f"{out}: cannot write the reduced output of {job.trace} ({exc})")
    written[str(out)] = job.trace
    return Outcome(job.trace, "reduced", str(out), result.rank, result=result)


def ingest_fanout(con: duckdb.DuckDBPyConnection, fanout: Fanout, options: IngestOptions = IngestOptions()) -> list[IngestResult]:
    """Ingest each run's reduced outputs (those that exist: a run with a failed trace is partial)."""
    if options.name is not None and len(fanout.runs) > 1:
        raise UsageError(f"--name names one run, but these paths hold {len(fanout.runs)} runs")
    results = []
    for run in fanout.runs:
        outputs = list(run.reduced) + [trace_path(fanout.outcomes[j.trace].out) for j in run.jobs
                                       if fanout.outcomes[j.trace].out is not None]
        if not outputs:
            continue
        for path in outputs:
            if not isinstance(path, Path):
                _register(con, path.fs)
        results.append(ingest_reduced_run(con, run_files(run, outputs), options))
    return results


def _register(con: duckdb.DuckDBPyConnection, fs) -> None:
    """Let DuckDB read a remote output's Parquet files through its fsspec filesystem (once per protocol)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if not any(con.filesystem_is_registered(p) for p in protocols):
        con.register_filesystem(fs)
