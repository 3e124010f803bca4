"""The file `bprof export --perfetto` writes, as a contract between the exporter and ingest: one
Chrome-trace JSON holding several ranks, and how ingest splits it back into per-rank traces.

Layout (version 1): `{"traceEvents": [...], "bprofExport": {...}}`, the events first (Perfetto's
JSON reader stops at the first top-level key it does not know, so ours comes after the events).
Each rank is one process (pid = rank) and its threads and streams get tids unique in the file
(Perfetto keys threads by tid alone); `bprofExport.ranks[i].threads` maps each back to the raw
pid and tid of the original trace. Times are on the aligned clock, in microseconds relative to
`bprofExport.base_time_ns` (exact to the nanosecond). What the exporter adds for display is
dropped again on ingest: its metadata events (process and thread names) and its arrows between
matched collectives (cat FLOW_CAT). Kineto's own flow events get ids unique in the file; the
original id rides along as ORIGINAL_ID_KEY. A collective call's CPU event carries the call's
process group, sequence number and peer as the original store had them (args[CALL_KEY]), which
ingest puts back (ingest_export_calls.sql), so the export matches as the original did without
the run's Flight Recorder files.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from bprof.errors import DataError
from bprof.store.kineto_file import SplitTrace

EXPORT_KEY = "bprofExport"
FORMAT = "bprof-perfetto"
FORMAT_VERSION = 1
CALL_KEY = "bprof.collective"  # in a collective call's args: its identity in the original store
FLOW_CAT = "bprof.match"  # category of the arrows between the members of a matched collective
ORIGINAL_ID_KEY = "bprof_id"  # on a Kineto flow event: its id in the original trace
CALLS_META_KEY = "bprof_export_calls"  # unpacked rank metadata: the calls' identities (see ingest.py)
CALL_FIELDS = ("op", "pg_name", "pg_desc", "pg_ranks", "group_size", "seq", "peer_rank", "dtype",
               "in_elems", "out_elems", "in_bytes", "out_bytes")


def is_export(metadata: dict) -> bool:
    return EXPORT_KEY in metadata


def unpack_export(split: SplitTrace, work_base: Path) -> list[SplitTrace]:
    """One SplitTrace per rank of an export (already split by split_trace): each rank's events in
    a work file next to `work_base`, with their raw pid/tid (and Kineto flow ids) restored, and a
    Kineto-like metadata dict; the calls' identities under CALLS_META_KEY."""
    path = split.path
    info = split.metadata[EXPORT_KEY]
    ranks = _ranks(info, path)
    base_ns = info["base_time_ns"]
    threads = {}  # export tid -> (rank, raw pid, raw tid)
    for rank, r in ranks.items():
        for t in r.get("threads") or []:
            if not isinstance(t, dict) or not isinstance(t.get("tid"), int):
                raise DataError(f"{path}: bprofExport: rank {rank} lists a thread without an integer tid")
            threads[t["tid"]] = (rank, t.get("pid"), t.get("raw_tid"))
    outs = {rank: work_base.with_name(f"{work_base.stem}.rank{rank}{work_base.suffix}") for rank in ranks}
    files = {rank: p.open("wb") for rank, p in outs.items()}
    counts = dict.fromkeys(ranks, 0)
    calls: dict[int, list] = {rank: [] for rank in ranks}
    try:
        for part in split.array_paths:
            try:
                events = orjson.loads(part.read_bytes())
            except orjson.JSONDecodeError as exc:
                raise DataError(f"{path}: invalid JSON in traceEvents ({exc})") from None
            part.unlink(missing_ok=True)
            for event in events:
                rank = _restore(event, threads, path)
                if rank is None:
                    continue
                call = (event.get("args") or {}).pop(CALL_KEY, None) if isinstance(event.get("args"), dict) else None
                if call is not None:
                    calls[rank].append(_call_row(rank, event, call, base_ns, path))
                    if not event["args"]:
                        del event["args"]
                files[rank].write(b"," if counts[rank] else b"[")
                files[rank].write(orjson.dumps(event))
                counts[rank] += 1
    finally:
        for rank, f in files.items():
            if not counts[rank]:
                f.write(b"[")
            f.write(b"]")
            f.close()
    empty = [rank for rank, n in counts.items() if n == 0]
    if empty:
        raise DataError(f"{path}: bprofExport lists rank {empty[0]}, but the file has no events of it")
    return [SplitTrace(path, (outs[rank],), (0,), outs[rank].stat().st_size, split.compressed,
                       _rank_metadata(info, ranks[rank], base_ns, calls[rank]))
            for rank in sorted(ranks)]


def _ranks(info, path: Path) -> dict[int, dict]:
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise DataError(f"{path}: bprofExport is not a {FORMAT} header")
    if info.get("version") != FORMAT_VERSION:
        raise DataError(f"{path}: bprofExport version {info.get('version')!r}; this bprof reads version {FORMAT_VERSION}")
    if not isinstance(info.get("base_time_ns"), int):
        raise DataError(f"{path}: bprofExport has no integer base_time_ns")
    ranks = info.get("ranks")
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) and isinstance(r.get("rank"), int)
                                                           for r in ranks):
        raise DataError(f"{path}: bprofExport has no list of ranks")
    return {r["rank"]: r for r in ranks}


def _restore(event, threads: dict, path: Path) -> int | None:
    """Give an exported event its raw pid/tid back; None for what the export added for display."""
    if not isinstance(event, dict):
        raise DataError(f"{path}: a traceEvents entry is not an object")
    if event.get("ph") == "M" or event.get("cat") == FLOW_CAT:
        return None
    owner = threads.get(event.get("tid"))
    if owner is None or owner[0] != event.get("pid"):
        raise DataError(f"{path}: an event on pid {event.get('pid')!r}, tid {event.get('tid')!r}, "
                        "a thread bprofExport does not list")
    rank, event["pid"], event["tid"] = owner
    if ORIGINAL_ID_KEY in event:
        original = event.pop(ORIGINAL_ID_KEY)
        if original is None:
            event.pop("id", None)
        else:
            event["id"] = original
    return rank


_CALL_TYPES = {"op": str, "pg_name": str, "pg_desc": str, "pg_ranks": list, "group_size": int, "seq": int,
               "peer_rank": int, "dtype": str, "in_elems": int, "out_elems": int, "in_bytes": int, "out_bytes": int}


def _call_row(rank: int, event: dict, call, base_ns: int, path: Path) -> list:
    """[rank, tid, cpu_ts_ns, *CALL_FIELDS]: a row of ingest's _export_calls."""
    if not isinstance(call, dict) or not isinstance(event.get("ts"), (int, float)) or not isinstance(call.get("op"), str):
        raise DataError(f"{path}: a collective call of rank {rank} without its op or time")
    for key, kind in _CALL_TYPES.items():
        value = call.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)
                                  or kind is list and not all(isinstance(v, int) for v in value)):
            raise DataError(f"{path}: a collective call of rank {rank} has a malformed {key} ({value!r})")
    # ts is µs relative to base_ns with at most 3 decimals: round(ts * 1000) is its exact ns
    return [rank, event["tid"], base_ns + round(event["ts"] * 1000), *(call.get(k) for k in CALL_FIELDS)]


def _rank_metadata(info: dict, r: dict, base_ns: int, calls: list) -> dict:
    run = info.get("run") or {}
    meta = {
        "baseTimeNanoseconds": base_ns,
        "bprof": {"rank": r["rank"], "host": r.get("host"), "local_rank": r.get("local_rank"),
                  **{k: run.get(k) for k in ("command", "git_sha", "git_branch") if run.get(k)},
                  "exported_from": {"run": run.get("name"), "step": info.get("step")}},
        CALLS_META_KEY: calls,
    }
    for key in ("distributedInfo", "deviceProperties"):
        if r.get(key) is not None:
            meta[key] = r[key]
    if run.get("model_flops_per_step") is not None:
        meta["bprof_model"] = {"model_flops_per_step": run["model_flops_per_step"]}
    return meta
