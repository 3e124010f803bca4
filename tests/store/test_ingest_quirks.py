"""Quirks of current stacks that real traces showed (issue 21), on minimal traces named after the
originals (tests/store/quirk_traces.py), checked against the independent reader where it fits."""

from __future__ import annotations

import json
from collections import Counter

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.ingest import ingest_paths
from tests.store.expected_counts import expected
from tests.store.quirk_traces import a100_ws16_empty_tensorlist, b200_vllm_tp8_driver_launch, pp4_plain_profiler_p2p
from tests.store.tiny_traces import write


def test_driver_api_launches_link_nccl_kernels_to_their_call_and_give_kernels_their_step(store, tmp_path):
    """NCCL 2.27 launches through cuLaunchKernelEx (cuda_driver): one all-gather was a c10d row
    without device time plus a kernel_only row, and driver-launched kernels lost their step."""
    path = write(tmp_path / "b200" / "rank0.json.gz", b200_vllm_tp8_driver_launch(0))
    want = expected(path)
    [r] = ingest_paths(store, [path.parent])
    got = dict(store.execute("SELECT op, count(*) FROM collectives WHERE run_id = ? GROUP BY op", [r.run_id]).fetchall())
    assert got == want["collectives"] == {"all_gather": 2}
    rows = store.execute("""SELECT source, num_kernels, device_dur_ns, in_bytes, out_bytes, step FROM collectives
                            WHERE run_id = ? ORDER BY call_index""", [r.run_id]).fetchall()
    assert rows == [("c10d", 1, 400_000, 2048, 16384, 1), ("c10d", 1, 400_000, 2048, 16384, 2)]
    kernel_steps = dict(store.execute("SELECT step, count(*) FROM events WHERE run_id = ? AND kind = 'kernel' GROUP BY step",
                                      [r.run_id]).fetchall())
    # the Triton and NCCL kernels run after their step's CPU range: only the launch tells the step
    assert kernel_steps == want["kernel_steps"] == {1: 3, 2: 3}


def test_an_empty_tensor_list_is_an_unknown_size_not_one_element(store, tmp_path, monkeypatch):
    """A TensorList recorded as [] (the A100 16-rank trace) became 1 element, 4 bytes: a size
    bprof invented. Unknown stays NULL from the call to the instance, and no bandwidth is computed."""
    for rank in range(2):
        path = write(tmp_path / "a100" / f"rank{rank}.json.gz", a100_ws16_empty_tensorlist(rank))
    assert expected(path)["c10d_elems"] == {("all_reduce", None): 1, ("all_reduce", 1000): 1}
    [r] = ingest_paths(store, [path.parent])
    assert store.execute("""SELECT dtype, in_elems, in_bytes FROM collectives WHERE run_id = ? AND rank = 1
                            ORDER BY call_index""", [r.run_id]).fetchall() == [("float", None, None), ("float", 1000, 4000)]
    monkeypatch.setattr(analysis, "ANALYZERS", ["match", "clock", "collperf"])
    analysis.analyze_run(store, r.run_id, Options())
    got = store.execute("""SELECT i.status, i.bytes, p.busbw_bytes_per_s IS NOT NULL FROM match_instances i
                           JOIN collperf_instances p USING (run_id, instance_id)
                           WHERE i.run_id = ? ORDER BY i.instance_id""", [r.run_id]).fetchall()
    assert got == [("complete", None, False), ("complete", 4000, True)]


def _pipeline(store, tmp_path, monkeypatch, **kwargs):
    paths = [write(tmp_path / "pp4" / f"rank{r}.json.gz", pp4_plain_profiler_p2p(r, **kwargs)) for r in range(4)]
    [r] = ingest_paths(store, [paths[0].parent])
    monkeypatch.setattr(analysis, "ANALYZERS", ["match"])
    analysis.analyze_run(store, r.run_id, Options())
    return r.run_id, paths


def test_pipeline_send_recv_take_their_peer_from_the_trace_and_pair(store, tmp_path, monkeypatch):
    """A 4-stage pipeline taken with plain torch.profiler: every send/recv stayed unmatched (peer
    unknown). torch writes Dst Rank / Src Rank; its Seq on send/recv is the collective counter,
    shared by every message of the step, so messages pair by order within it."""
    run_id, paths = _pipeline(store, tmp_path, monkeypatch)
    want = Counter()
    for path in paths:
        want.update(expected(path)["p2p_messages"])
    sends = {(src, dst): n for (op, src, dst), n in want.items() if op == "send"}
    assert sends == {(src, dst): n for (op, src, dst), n in want.items() if op == "recv"}  # each side agrees
    assert sends == {(0, 1): 4, (1, 2): 4, (2, 3): 4, (1, 0): 4, (2, 1): 4, (3, 2): 4}
    assert store.execute("""SELECT op, count(*), count(peer_rank), count(seq) FROM collectives WHERE run_id = ?
                            GROUP BY op ORDER BY op""", [run_id]).fetchall() \
        == [("all_reduce", 8, 0, 8), ("recv", 24, 24, 24), ("send", 24, 24, 24)]
    got = dict(((src, dst), n) for src, dst, n in store.execute("""
        SELECT src_rank, dst_rank, count(*) FROM match_instances
        WHERE run_id = ? AND is_p2p AND status = 'complete' AND num_members = 2 GROUP BY ALL""", [run_id]).fetchall())
    assert got == sends
    # each step's 8 messages of a rank share its Seq: they pair in order within it
    assert store.execute("""SELECT DISTINCT seq, step FROM match_instances WHERE run_id = ? AND is_p2p ORDER BY 1""",
                         [run_id]).fetchall() == [(1, 1), (2, 2)]
    assert store.execute("SELECT count(*) FROM match_instances WHERE run_id = ? AND status <> 'complete'",
                         [run_id]).fetchone()[0] == 0
    assert store.execute("SELECT count(*) FROM findings WHERE run_id = ? AND analyzer = 'match'",
                         [run_id]).fetchone()[0] == 0


def test_send_recv_without_a_known_peer_are_reported_with_their_count(store, tmp_path, monkeypatch):
    """An older torch writes no peer: the calls stay unmatched, and a finding says how many and
    what that prevents (before, nothing did)."""
    run_id, _ = _pipeline(store, tmp_path, monkeypatch, peers=False)
    assert store.execute("SELECT count(*) FROM collectives WHERE run_id = ? AND is_p2p AND peer_rank IS NULL",
                         [run_id]).fetchone()[0] == 48
    [(severity, title, detail, evidence)] = store.execute(
        "SELECT severity, title, detail, evidence FROM findings WHERE run_id = ? AND analyzer = 'match'", [run_id]).fetchall()
    assert severity == "warning"
    assert title == "48 send/recv calls on group 0 (default_pg) stay unmatched: their peer is unknown"
    assert "no straggler attribution" in detail and "Dst Rank" in detail
    assert json.loads(evidence)["num_calls"] == 48 and json.loads(evidence)["ranks"] == [0, 1, 2, 3]
