"""Find the trace files of a run on disk and tell each file's rank.

Accepted layouts: single files (.json, .json.gz), a directory of per-rank files (HTA style,
bprof run directories with traces/ and meta/), and torchtitan's
profiling/traces/iteration_N/rankR_trace.json.gz, where each iteration folder is its own run.
`bprof reduce` outputs (rank<R>.reduced directories) make a run of their own where no trace is
given: where a folder holds both, as a `bprof record --reduce` directory does, the traces win
unless `prefer_reduced` (bprof ingest --reduced) says otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bprof.errors import DataError, UsageError
from bprof.store.reduce import SUFFIX, is_reduced_dir, reduced_dirs

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
# bprof record writes a restarted job's windows (torchrun --max-restarts) as iteration_<N>.restart<k>
_ITERATION_DIR = re.compile(r"iteration_(\d+)(?:\.restart(\d+))?$")
_NOT_TRACES = {"truth.json"}
_IN_REDUCED = re.compile(re.escape(SUFFIX) + r"($|\.tmp)")  # rank<R>.reduced, or one being written


@dataclass(frozen=True)
class RunFiles:
    """The files of one run and the name the run gets by default."""

    default_name: str
    files: tuple[Path, ...]
    reduced: bool = False  # files are rank<R>.reduced directories, not traces
    # the files named on their own (not found in a directory): one of them that is no trace is an
    # error, while a stray .json found beside the rank traces (a config, a sidecar) is skipped
    named: frozenset[Path] = frozenset()


def is_trace_name(path: Path) -> bool:
    name = path.name
    if name in _NOT_TRACES or ".et." in name or ".tmp." in name or name.endswith(".fr.json") or "meta" in path.parent.parts:
        return False
    if any(_IN_REDUCED.search(part) for part in path.parent.parts):
        return False
    return name.endswith(".json") or name.endswith(".json.gz")


def discover(paths: list[Path], prefer_reduced: bool = False) -> list[RunFiles]:
    """Group the given paths into runs: one run for the whole list, except torchtitan roots (and
    bprof record directories with several windows: one run per window)."""
    if not paths:
        raise UsageError("no trace path given")
    loose: list[Path] = []
    reduced: list[Path] = []
    runs: list[RunFiles] = []
    recorded_windows: dict[str, list[Path]] = {}  # bprof record directories: hosts merge per window
    reduced_windows: dict[str, list[Path]] = {}  # the same, for windows with reduced outputs only
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise UsageError(f"{path}: no such file or directory")
        if is_reduced_dir(path):
            reduced.append(path)
            continue
        if path.is_file():
            loose.append(path)
            continue
        recorded = (path / "traces").is_dir() and (path / "meta").is_dir()
        base = path / "traces" if recorded else path
        iterations = sorted((d for d in base.iterdir() if d.is_dir() and _ITERATION_DIR.match(d.name)),
                            key=lambda d: _window_order(d.name))
        if recorded:
            for d in iterations:
                files, found = _pick(d, prefer_reduced)
                if files:
                    recorded_windows.setdefault(d.name, []).extend(files)
                elif found:
                    reduced_windows.setdefault(d.name, []).extend(found)
            if not iterations:
                raise UsageError(f"{path}: a bprof record directory with no captured window")
            continue
        if iterations:
            for d in iterations:
                files, found = _pick(d, prefer_reduced)
                if files:
                    runs.append(RunFiles(f"{_dir_name(path)}-{d.name}", files))
                elif found:
                    runs.append(RunFiles(f"{_dir_name(path)}-{d.name}", found, reduced=True))
            continue
        files, found = _pick(path, prefer_reduced)
        if found:
            reduced.extend(found)
            continue
        if not files:
            raise UsageError(f"{path}: no trace files (*.json, *.json.gz) or reduced outputs (*{SUFFIX}) in this directory")
        loose.extend(files)
    first = Path(paths[0])
    for windows, is_reduced in ((recorded_windows, False), (reduced_windows, True)):
        for window, files in sorted(windows.items(), key=lambda item: _window_order(item[0])):
            name = _dir_name(first) if len(windows) == 1 else f"{_dir_name(first)}-{window}"
            runs.append(RunFiles(name, tuple(sorted(files)), reduced=is_reduced))
    if loose and reduced:
        raise UsageError(f"{reduced[0]} is a reduced output and {loose[0]} a trace: ingest traces and reduced "
                         "outputs as separate runs")
    if loose:
        name = _dir_name(first) if first.is_dir() else _file_stem(first)
        named = frozenset(Path(p) for p in paths if Path(p).is_file())
        runs.insert(0, RunFiles(name, tuple(sorted(set(loose))), named=named))
    if reduced:
        runs.insert(0, RunFiles(_reduced_run_name(first), tuple(sorted(reduced)), reduced=True))
    return runs


def record_meta_paths(trace: Path, rank: int) -> tuple[Path, Path] | None:
    """For a trace in a `bprof record` directory (run/traces/iteration_N/rankR.json.gz): its rank's
    metadata (run/meta/rankR.json) and the window's Flight Recorder entries
    (run/meta/iteration_N/rankR.fr.json); None for other traces."""
    window, traces = trace.parent, trace.parent.parent
    if traces.name != "traces" or not _ITERATION_DIR.match(window.name):
        return None
    meta = traces.parent / "meta"
    return meta / f"rank{rank}.json", meta / window.name / f"rank{rank}.fr.json"


def rank_of(path: Path, metadata: dict, explicit: int | None) -> int:
    """The rank of a trace: bprof capture metadata, distributedInfo, the file name, or --rank."""
    bprof_meta = metadata.get("bprof")
    if isinstance(bprof_meta, dict) and isinstance(bprof_meta.get("rank"), int):
        return bprof_meta["rank"]
    dist = metadata.get("distributedInfo")
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        return dist["rank"]
    match = _RANK_IN_NAME.search(path.name)
    if match:
        return int(match.group(1))
    if explicit is not None:
        return explicit
    raise DataError(f"{path}: cannot tell its rank (no distributedInfo, no rankN in the file name); pass --rank")


def _pick(directory: Path, prefer_reduced: bool) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """(traces, ()) or ((), reduced outputs) of a directory: the traces, unless there are none or
    reduced outputs are preferred and present."""
    files = _trace_files(directory)
    if files and not prefer_reduced:
        return files, ()
    found = reduced_dirs(directory)
    return ((), found) if found else (files, ())


def _window_order(name: str) -> tuple[int, int]:
    """iteration_<N>[.restart<k>] -> (N, k): windows in order, each window's attempts in order."""
    start, attempt = _ITERATION_DIR.match(name).groups()
    return int(start), int(attempt or 0)


def _trace_files(directory: Path) -> tuple[Path, ...]:
    return tuple(sorted(p for p in directory.rglob("*") if p.is_file() and is_trace_name(p)))


def _reduced_run_name(first: Path) -> str:
    """A directory of reduced outputs is named as itself; a rank<R>.reduced given alone by its run:
    the bprof record directory around it (run/traces/iteration_N/), else the folder holding it."""
    if not is_reduced_dir(first):
        return _dir_name(first)
    window = first.resolve().parent
    if _ITERATION_DIR.match(window.name) and window.parent.name == "traces":
        return _dir_name(window.parent.parent)
    return _dir_name(window)


def _dir_name(path: Path) -> str:
    return path.resolve().name or "run"


def _file_stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    return name or "run"
