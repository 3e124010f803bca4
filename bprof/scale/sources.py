"""Which traces the given paths hold, grouped into runs as ingest groups them, and the folder each
trace's reduced output goes to: beside the trace, or under --out with the layout below the given
path kept (so two iterations' rank 0 do not meet). One trace file given with --out: --out is the
output directory itself, as for `bprof reduce TRACE --out DIR` before.

Local paths are grouped by bprof.store.discover. A URL (s3://, gs://, hdfs://, memory://) is one
run: the trace it names, or every trace below it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bprof.errors import UsageError
from bprof.store.discover import RunFiles, discover, is_trace_name
from bprof.store.kineto_file import is_url, trace_path


@dataclass(frozen=True)
class Job:
    trace: str  # as the worker opens it: a local path or a URL
    out_dir: str  # the folder that gets rank<R>.reduced (or, when exact, the output itself)
    exact: bool = False


@dataclass(frozen=True)
class PlannedRun:
    name: str  # the run's default name, as ingest would give it
    jobs: tuple[Job, ...] = ()
    reduced: tuple = ()  # outputs given already reduced (a folder of rank<R>.reduced): ingested as they are


def plan(paths: list[str], out: str | None = None) -> list[PlannedRun]:
    """The runs under `paths` (all local, or all URLs) and where each trace's output goes."""
    if not paths:
        raise UsageError("no trace path given")
    urls = [is_url(p) and not str(p).startswith("file://") for p in paths]
    if any(urls) and not all(urls):
        raise UsageError(f"{paths[urls.index(False)]}: give local paths and URLs in separate commands")
    if all(urls):
        return [_plan_url(paths, out)]
    local = [trace_path(p) for p in paths]  # file:// URLs become local paths
    exact = out is not None and len(local) == 1 and local[0].is_file()
    runs = []
    for run in discover(local):
        if run.reduced:
            runs.append(PlannedRun(run.default_name, reduced=run.files))
            continue
        runs.append(PlannedRun(run.default_name, tuple(_local_job(f, local, out, exact) for f in run.files)))
    return runs


def _local_job(trace: Path, given: list[Path], out: str | None, exact: bool) -> Job:
    if out is None:
        return Job(str(trace), str(trace.parent))
    if exact:
        return Job(str(trace), str(trace_path(out)), exact=True)
    root = _root(trace, given)
    return Job(str(trace), _join(out, trace.parent.resolve().relative_to(root).parts))


def _root(trace: Path, given: list[Path]) -> Path:
    """The given directory that holds `trace` (the nearest), or the trace's own folder."""
    resolved = trace.resolve()
    holding = [g.resolve() for g in given if g.is_dir() and resolved.is_relative_to(g.resolve())]
    return max(holding, key=lambda g: len(g.parts)) if holding else resolved.parent


def _plan_url(urls: list[str], out: str | None) -> PlannedRun:
    jobs = []
    for url in urls:
        path = trace_path(url)
        if path.is_file():
            jobs.append(Job(str(path), _join(out, ()) if out else str(path.parent), exact=False))
            continue
        if not path.is_dir():
            raise UsageError(f"{url}: no such file or directory")
        found = sorted((p for p in path.rglob("*") if is_trace_name(p) and p.is_file()), key=str)
        if not found:
            raise UsageError(f"{url}: no trace files (*.json, *.json.gz) below this URL")
        for trace in found:
            below = trace.parent.parts[len(path.parts):]
            jobs.append(Job(str(trace), _join(out, below) if out else str(trace.parent)))
    name = trace_path(urls[0]).name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return PlannedRun(name or "run", tuple(jobs))


def _join(base: str, parts: tuple[str, ...]) -> str:
    """`base` (a local path or a URL) with the folders `parts` below it."""
    path = trace_path(base)
    for part in parts:
        path = path / part
    return str(path)


def run_files(run: PlannedRun, outputs: list) -> RunFiles:
    """The RunFiles ingest takes for a run's reduced outputs."""
    return RunFiles(run.name, tuple(sorted(outputs, key=str)), reduced=True)
