"""bprof's store against the raw JSON of every real corpus trace, computed independently by
tests/store/expected_counts.py (stdlib JSON walking, no bprof code): ranks, devices, events, steps,
kernels, memcpy/memset, collectives per op and size, the step of each kernel, device busy time, and
after analysis the idle time of every device step and the kernel-class totals."""

from __future__ import annotations

import pytest

from bprof.analyzers.run import analyze_run
from bprof.store.ingest import IngestOptions, ingest_paths
from tests.real.corpus import rank_files, trace_dir, traces
from tests.store.expected_counts import busy_ns, device_counts, expected, load_exact

# trace id -> reason, for a disagreement that is a bprof bug not fixed yet (strict: the fix shows)
KNOWN_BUGS: dict[str, str] = {}


def cases() -> list:
    return [pytest.param(t, id=t["id"], marks=[pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[t["id"]])]
                         if t["id"] in KNOWN_BUGS else []) for t in traces()]


def raw_ranks(trace: dict) -> dict[int, tuple[dict, dict]]:
    """rank -> (expected() counts, the exactly parsed trace) for every file of the trace."""
    out = {}
    for path in rank_files(trace):
        want = expected(path)
        rank = want["rank"] if want["rank"] is not None else trace["rank"]
        out[rank] = (want, load_exact(path))
    return out


def store_busy_ns(store, run: int, rank: int, lo: int | None = None, hi: int | None = None) -> int:
    """The union of the rank's device intervals as the store holds them (SQL, gaps-and-islands)."""
    lo = -(2**62) if lo is None else lo
    hi = 2**62 if hi is None else hi
    return store.execute("""
        WITH iv AS (
            SELECT greatest(ts_ns, $lo) AS s, least(ts_ns + dur_ns, $hi) AS e FROM events
            WHERE run_id = $run AND rank = $rank AND kind IN ('kernel', 'gpu_memcpy', 'gpu_memset')
        ), ordered AS (
            SELECT s, e, max(e) OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
            FROM iv WHERE e > s
        ), islands AS (
            SELECT s, e, sum(CASE WHEN reach IS NULL OR s >= reach THEN 1 ELSE 0 END) OVER (ORDER BY s, e) AS island
            FROM ordered
        )
        SELECT coalesce(sum(hi_e - lo_s), 0) FROM (SELECT min(s) AS lo_s, max(e) AS hi_e FROM islands GROUP BY island)""",
        {"lo": lo, "hi": hi, "run": run, "rank": rank}).fetchone()[0]


@pytest.mark.parametrize("trace", cases())
def test_store_agrees_with_the_raw_json(store, trace):
    trace_dir(trace)
    raw = raw_ranks(trace)
    [result] = ingest_paths(store, [trace_dir(trace)], IngestOptions(rank=trace["rank"]))
    run = result.run_id
    assert sorted(r for (r,) in store.execute("SELECT rank FROM ranks WHERE run_id = ?", [run]).fetchall()) == sorted(raw)
    for rank, (want, exact) in sorted(raw.items()):
        where = [run, rank]
        device, num_events = store.execute(
            "SELECT device_name, num_events FROM ranks WHERE run_id = ? AND rank = ?", where).fetchone()
        assert num_events == want["num_events"], f"rank {rank}"
        if want["device_name"] is not None:
            assert device == want["device_name"], f"rank {rank}"
        assert store.execute("SELECT count(*) FROM steps WHERE run_id = ? AND rank = ?", where).fetchone()[0] \
            == want["num_steps"], f"rank {rank}: steps"
        got_kinds = dict(store.execute("""SELECT kind, count(*) FROM events WHERE run_id = ? AND rank = ?
            AND kind IN ('kernel', 'gpu_memcpy', 'gpu_memset') GROUP BY kind""", where).fetchall())
        dev = device_counts(exact)
        assert (got_kinds.get("kernel", 0), got_kinds.get("gpu_memcpy", 0), got_kinds.get("gpu_memset", 0)) \
            == (dev["kernels"], dev["memcpy"], dev["memset"]), f"rank {rank}: device events"
        assert dev["kernels"] == want["num_kernels"]
        got = dict(store.execute("SELECT op, count(*) FROM collectives WHERE run_id = ? AND rank = ? GROUP BY op",
                                 where).fetchall())
        assert got == want["collectives"], f"rank {rank}: collectives per op"
        assert {(op, n): k for op, n, k in store.execute(
            "SELECT op, in_elems, count(*) FROM collectives WHERE run_id = ? AND rank = ? AND source = 'c10d' GROUP BY ALL",
            where).fetchall()} == want["c10d_elems"], f"rank {rank}: c10d calls by input elements"
        assert {(op, n): k for op, n, k in store.execute("""SELECT op, in_elems, count(*) FROM collectives
            WHERE run_id = ? AND rank = ? AND source = 'record_param_comms' AND raw_name LIKE 'nccl:%' GROUP BY ALL""",
            where).fetchall()} == want["nccl_range_elems"], f"rank {rank}: nccl:<op> range calls by input elements"
        assert dict(store.execute("""SELECT step, count(*) FROM events WHERE run_id = ? AND rank = ? AND kind = 'kernel'
            GROUP BY step""", where).fetchall()) == want["kernel_steps"], f"rank {rank}: kernels per step"
        first, last = store.execute("""SELECT min(ts_ns), max(ts_ns + dur_ns) FROM events WHERE run_id = ? AND rank = ?
            AND kind IN ('kernel', 'gpu_memcpy', 'gpu_memset')""", where).fetchone()
        assert (first, last) == (dev["first_ns"], dev["last_ns"]), f"rank {rank}: device span"
        assert store_busy_ns(store, run, rank) == dev["busy_ns"], f"rank {rank}: device busy time"

    analyze_run(store, run)
    for rank, (want, exact) in sorted(raw.items()):
        spans = store.execute("""SELECT t.step, t.ts_ns, t.dur_ns, b.idle_ns FROM timeline_spans t
            JOIN breakdown_steps b USING (run_id, rank, step)
            WHERE t.run_id = ? AND t.rank = ? AND t.timeline = 'device' ORDER BY t.step""", [run, rank]).fetchall()
        dev = device_counts(exact)
        if dev["kernels"] + dev["memcpy"] + dev["memset"]:
            assert spans, f"rank {rank}: a trace with device work has device steps"
        for step, ts_ns, dur_ns, idle_ns in spans:
            assert idle_ns == dur_ns - busy_ns(exact, ts_ns, ts_ns + dur_ns), f"rank {rank} step {step}: idle"
        # kernel classes count the device events of the spans (kernels outside every step are left out;
        # their step, checked above against the raw JSON, says which those are)
        classes = dict(store.execute("""SELECT fine_class, sum(num_events) FROM kernels_classes
            WHERE run_id = ? AND rank = ? GROUP BY fine_class""", [run, rank]).fetchall())
        in_spans = dict(store.execute("""SELECT kind, count(*) FROM events e WHERE run_id = $run AND rank = $rank
            AND kind IN ('kernel', 'gpu_memcpy', 'gpu_memset')
            AND (coalesce(step, -1) IN (SELECT step FROM timeline_spans WHERE run_id = $run AND rank = $rank)
                 OR -1 IN (SELECT step FROM timeline_spans WHERE run_id = $run AND rank = $rank))
            GROUP BY kind""", {"run": run, "rank": rank}).fetchall())
        if spans:
            assert sum(classes.values()) == sum(in_spans.values()), f"rank {rank}: classes"
            assert (classes.get("memcpy", 0), classes.get("memset", 0)) == \
                (in_spans.get("gpu_memcpy", 0), in_spans.get("gpu_memset", 0)), f"rank {rank}: memcpy/memset class"
            if len(in_spans) and sum(in_spans.values()) == dev["kernels"] + dev["memcpy"] + dev["memset"]:
                assert classes.get("communication", 0) >= dev["comm_kernels"], f"rank {rank}: NCCL/RCCL kernels"
