"""Issue 21 item 5 through analysis: on the MI300X-like trace (the host runs ahead, the device's queue
grows) the step time, the partition, HFU's denominator and the phases are the device's steps, not
the CPU ranges, the growing queue is said, and a starved device (host-bound) is not called a queue.
Expectations come from what tests/store/device_lag_trace.py wrote."""

from __future__ import annotations

import statistics

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.db import open_store
from bprof.store.ingest import ingest_paths
from tests.store.device_lag_trace import write_device_lag_trace
from tests.store.test_device_lag import expected_device_steps


def _analysed(tmp_path, **kw):
    written = write_device_lag_trace(tmp_path / "run" / "rank0.json.gz", **kw)
    con = open_store(tmp_path / "s.duckdb")
    [result] = ingest_paths(con, [tmp_path / "run"])
    analysis.analyze_run(con, result.run_id, Options())
    return con, result.run_id, written


@pytest.fixture(scope="module")
def mi300x(tmp_path_factory):
    con, run_id, written = _analysed(tmp_path_factory.mktemp("mi300x"))
    yield con, run_id, written
    con.close()


def _metric(con, run_id, name):
    return con.execute("SELECT value FROM metrics WHERE run_id = ? AND name = ?", [run_id, name]).fetchone()[0]


def test_step_time_is_the_device_work_each_step_launched(mi300x):
    con, run_id, w = mi300x
    want = expected_device_steps(w.cpu_steps, w.kernels, w.launches)
    spans = dict(con.execute("SELECT step, dur_ns FROM timeline_spans WHERE run_id = ?", [run_id]).fetchall())
    assert spans == {s: pytest.approx(d, abs=2) for s, (_, d, _) in want.items()}
    assert _metric(con, run_id, "step_time_ns") == pytest.approx(statistics.median(d for _, d, _ in want.values()), abs=2)
    assert _metric(con, run_id, "step_time_max_ns") == pytest.approx(max(d for _, d, _ in want.values()), abs=2)
    # not the CPU ranges (16.8 ms as the step), and no 53.8 ms last step
    assert _metric(con, run_id, "step_time_ns") > max(d for _, _, d in w.cpu_steps)
    per_step = dict(con.execute("SELECT step, value FROM step_metrics WHERE run_id = ? AND name = 'step_time_ns'",
                                [run_id]).fetchall())
    assert per_step == spans


def test_the_partition_is_the_device_steps_compute_with_no_other(mi300x):
    con, run_id, w = mi300x
    rows = con.execute("""SELECT step, span_ns, compute_ns, exposed_comm_ns, overlapped_comm_ns, memcpy_ns, idle_ns,
                                 other_ns FROM breakdown_steps WHERE run_id = ? ORDER BY step""", [run_id]).fetchall()
    want = expected_device_steps(w.cpu_steps, w.kernels, w.launches)
    for step, span, compute, exposed, overlapped, memcpy, idle, other in rows:
        assert span == pytest.approx(want[step][1], abs=2)
        # the step's kernels run back to back and fill its device step: all of it is compute
        launched = sum(d for s, _, d in w.kernels if s == step)
        assert compute == pytest.approx(launched, abs=10)
        assert (exposed, overlapped, memcpy, other) == (0, 0, 0, 0)
        assert compute + idle == span


def test_phases_tile_the_host_step_not_the_device_span(mi300x):
    con, run_id, w = mi300x
    got = dict(con.execute("SELECT step, sum(dur_ns) FROM phases_steps WHERE run_id = ? GROUP BY step",
                           [run_id]).fetchall())
    cpu = sorted(w.cpu_steps)
    # the host's step: to the next step's ProfilerStep start, the last to its CPU range end
    host = {s: (cpu[i + 1][1] if i + 1 < len(cpu) else ts + d) - ts for i, (s, ts, d) in enumerate(cpu)}
    assert got == {s: pytest.approx(v, abs=2) for s, v in host.items()}
    # the last step's 38 ms tail after its CPU range is not host time called "other"
    other = dict(con.execute("SELECT step, dur_ns FROM phases_steps WHERE run_id = ? AND phase = 'other'",
                             [run_id]).fetchall())
    assert other[3] < host[3] / 2


def test_hfu_divides_by_the_device_step(mi300x):
    con, run_id, w = mi300x
    step_s = statistics.median(d for _, d, _ in expected_device_steps(w.cpu_steps, w.kernels, w.launches).values()) * 1e-9
    # 8 bf16 mm of 4096 x 4096 x 4096 per step (what the writer recorded), 2 FLOPs per multiply-add
    flops = 8 * 2 * 4096 ** 3
    peak = _metric(con, run_id, "peak_flops_per_s_per_device")
    assert _metric(con, run_id, "hfu_frac") == pytest.approx(flops / (step_s * peak), rel=1e-6)


def test_a_growing_queue_is_said(mi300x):
    con, run_id, w = mi300x
    rows = con.execute("SELECT severity, title, evidence->>'$.device_lag_ns', evidence->>'$.ranks' FROM findings "
                       "WHERE run_id = ? AND analyzer = 'timeline' AND title LIKE 'Device queue grows%'",
                       [run_id]).fetchall()
    assert len(rows) == 1
    severity, title, lags, ranks = rows[0]
    want = expected_device_steps(w.cpu_steps, w.kernels, w.launches)
    assert [int(x) for x in lags.strip("[]").split(",")] == [pytest.approx(v[2], abs=2) for _, v in sorted(want.items())]
    assert ranks == "[0]" and "rank 0" in title


def test_a_starved_device_is_not_a_queue_and_its_idle_is_in_the_step(tmp_path):
    con, run_id, w = _analysed(tmp_path, device_steps_ms=(4.0, 4.0, 4.0), pre_window=False)
    try:
        assert not con.execute("SELECT count(*) FROM findings WHERE run_id = ? AND title LIKE 'Device queue grows%'",
                               [run_id]).fetchone()[0]
        want = expected_device_steps(w.cpu_steps, w.kernels, w.launches)
        rows = con.execute("SELECT step, span_ns, compute_ns, idle_ns FROM breakdown_steps WHERE run_id = ? ORDER BY step",
                           [run_id]).fetchall()
        for step, span, compute, idle in rows:
            assert span == pytest.approx(want[step][1], abs=2)
            assert compute == pytest.approx(sum(d for s, _, d in w.kernels if s == step), abs=10)
            assert idle == span - compute
        # steps after the first hold the device's wait for their launches: they are about the host's steps
        assert sum(r[3] for r in rows[1:]) > 0
    finally:
        con.close()
