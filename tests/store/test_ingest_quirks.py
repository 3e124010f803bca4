"""Quirks of current stacks that real traces showed (issue 21), on minimal traces named after the
originals (tests/store/quirk_traces.py), checked against the independent reader where it fits."""

from __future__ import annotations

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.ingest import ingest_paths
from tests.store.expected_counts import expected
from tests.store.quirk_traces import a100_ws16_empty_tensorlist, b200_vllm_tp8_driver_launch
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
