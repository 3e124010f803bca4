"""The reduced outputs on disk (or an fsspec store): which trace already has a complete one, and
writing a finished task's files.

Done means what ingest would accept and nothing newer to make: a rank<R>.reduced folder whose
manifest names this trace (its resolved path or URL) at its current size in bytes, and whose every
file matches the manifest's size and sha256 (bprof.store.reduce.read_manifest). A truncated or
half-written output, or one made from an earlier trace of another size, is reduced again."""

from __future__ import annotations

import json
from pathlib import Path

from bprof.errors import DataError
from bprof.scale.sources import Job
from bprof.store.kineto_file import trace_path, trace_text
from bprof.store.reduce import MANIFEST, SUFFIX, read_manifest, replaced_dir


class Existing:
    """The reduced outputs found in the output folders, read once per folder."""

    def __init__(self):
        self._by_folder: dict[str, dict[tuple[str, int], object]] = {}

    def find(self, job: Job):
        """The complete output made from this job's trace as it is now, or None."""
        trace = trace_path(job.trace)
        key = (trace_text(trace), trace.stat().st_size)
        if job.exact:
            candidates = _index([trace_path(job.out_dir)])
        else:
            if job.out_dir not in self._by_folder:
                folder = trace_path(job.out_dir)
                dirs = [p for p in folder.iterdir() if p.name.endswith(SUFFIX) and p.is_dir()] if folder.is_dir() else []
                self._by_folder[job.out_dir] = _index(dirs)
            candidates = self._by_folder[job.out_dir]
        found = candidates.get(key)
        if found is None:
            return None
        try:
            read_manifest(found)  # every file against its size and sha256
        except DataError:
            return None
        return found


def _index(dirs: list) -> dict[tuple[str, int], object]:
    """(trace, trace bytes) -> output folder, from each manifest that can be read."""
    index = {}
    for d in dirs:
        try:
            trace = json.loads((d / MANIFEST).read_bytes()).get("trace") or {}
        except (OSError, ValueError):
            continue
        if isinstance(trace.get("path"), str) and isinstance(trace.get("bytes"), int):
            index[(trace["path"], trace["bytes"])] = d
    return index


def target(job: Job, rank: int):
    """Where the output of `job` goes, once its rank is known."""
    folder = trace_path(job.out_dir)
    return folder if job.exact else folder / f"rank{rank}{SUFFIX}"


def write_output(files: dict[str, bytes], out) -> None:
    """Put a reduced output's files at `out`, replacing what is there. Locally, under a temporary
    name renamed into place (whole or not at all); on an fsspec store, which has no rename of
    folders, the manifest is written last, so a partial upload fails read_manifest and is redone."""
    if isinstance(out, Path):
        with replaced_dir(out) as staging:
            for name, data in files.items():
                (staging / name).write_bytes(data)
        return
    if out.exists():
        out.fs.rm(out.path, recursive=True)
    out.mkdir(parents=True, exist_ok=True)
    for name in sorted(files, key=lambda n: n == MANIFEST):
        (out / name).write_bytes(files[name])
