"""bprof replay on a real recording of examples/train_gpt.py with its planted cases (--no-bucket,
--transposed-matmul, --matmul-loop; torchrun, 2 CPU ranks, gloo), real replays here, and the op
listing of a real GPU trace. Verdicts are asserted only where the effect is large on any CPU: a loop
of 64 32x32 matmuls against one bmm (5-8x), and fp32 against bf16 matmuls on a CPU without bf16
matrix units (3-5x slower). No test holds a timing threshold."""

from __future__ import annotations

import json

import pytest
import torch

from bprof.errors import UsageError
from bprof.replay.plan import make_plan
from bprof.replay.rebuild import NotRebuildable, make_tensor, rebuild
from bprof.replay.run import ReplayOptions, replay
from bprof.store.db import open_store
from tests.analyzers.recorded import analysed, record_train_gpt
from tests.cli.test_cli import bprof

QUICK = dict(repeats=3, min_time_s=0.005)
VERDICT = dict(repeats=7, min_time_s=0.005)  # 7 pairs: the fewest a sign test can call at 5 %


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The recording, analysed (findings to link to); the store path."""
    out = tmp_path_factory.mktemp("replay")
    db = record_train_gpt(out, "planted", ["--no-bucket", "--transposed-matmul", "--matmul-loop"], steps="3:5")
    con, _ = analysed(db, None)
    con.close()
    return db


def test_plan_finds_the_planted_loop_storm_and_transposed_matmul(planted):
    con = open_store(planted)
    try:
        plan = make_plan(con, None, top=3)
        assert plan.intra_op_threads == 1  # the recording ran with OMP_NUM_THREADS=1
        [loop] = [i for i in plan.ops if i.kind == "op_loop"]
        assert (loop.name, loop.loop_len, loop.dims) == ("aten::mm", 64, [[32, 32], [32, 32]])
        assert loop.calls_per_step == 16  # 4 blocks x 4 micro-batches per step
        [storm] = [c for c in plan.collectives if c.kind == "collective_storm"]
        assert storm.op == "all_reduce" and len(storm.elems) >= 8 and storm.group_size == 2
        # the parameter tensors of a 4-block model: every gradient all-reduced on its own
        assert sum(storm.elems) == 932_608
        [transposed] = make_plan(con, None, top=5, op="aten::matmul").ops
        assert transposed.dims[:2] == [[64, 4, 128], [128, 8]]
        assert transposed.strides[0] == [128, 8192, 1]  # the (seq, batch, hidden) view of a (batch, seq, hidden) tensor
        # the matmuls of the model verify the kernels analyzer's fp32 finding
        assert any(i.finding_title and i.finding_title.startswith("fp32 matmuls") for i in plan.ops)
        with pytest.raises(UsageError, match="op 'aten::nonexistent' not found in run 'planted': no such op in the run"):
            make_plan(con, None, op="aten::nonexistent")
    finally:
        con.close()


def test_loop_of_small_matmuls_is_verified_faster_as_one_bmm(planted):
    con = open_store(planted)
    try:
        _, results = replay(con, ReplayOptions(op="aten::mm", top=1, variants=("bmm",), **VERDICT))
    finally:
        con.close()
    [base] = [r for r in results if r.item_kind == "op_loop" and r.variant == "baseline"]
    [bmm] = [r for r in results if r.item_kind == "op_loop" and r.variant == "bmm"]
    assert base.status == bmm.status == "replayed" and base.num_threads == 1
    assert bmm.verdict == "faster" and bmm.speedup > 1
    assert len(base.replayed_samples_ns) == 7 and base.replayed_spread_frac is not None


def test_bf16_matmul_on_this_cpu_is_reported_slower(planted):
    if "amx_bf16" in open("/proc/cpuinfo").read() or "avx512_bf16" in open("/proc/cpuinfo").read():
        pytest.skip("this CPU has bf16 matrix instructions: bf16 may really be faster here")
    con = open_store(planted)
    try:
        _, results = replay(con, ReplayOptions(op="aten::mm", top=1, variants=("bf16",), **VERDICT))
    finally:
        con.close()
    [bf16] = [r for r in results if r.item_kind == "op" and r.variant == "bf16"]
    assert bf16.verdict == "slower" and bf16.speedup < 1


def test_transposed_view_is_rebuilt_with_its_strides_and_the_contiguous_variant_runs(planted):
    con = open_store(planted)
    try:
        [item] = make_plan(con, None, top=1, op="aten::matmul").ops
        rebuilt = rebuild(torch, item.name, item.dims, item.types, item.strides, item.concrete, torch.device("cpu"))
        x = rebuilt.args[0]
        assert list(x.shape) == [64, 4, 128] and list(x.stride()) == [128, 8192, 1] and not x.is_contiguous()
        _, results = replay(con, ReplayOptions(op="aten::matmul", top=1, variants=("contiguous",), **QUICK))
    finally:
        con.close()
    [cont] = [r for r in results if r.variant == "contiguous"]
    assert cont.status == "replayed" and cont.verdict in ("faster", "no better than noise", "slower")
    assert "outside the timed calls" in cont.reason


def test_cli_json_table_findings_and_collectives(planted, tmp_path):
    done = bprof("replay", "--db", planted, "--top", "1", "--repeats", "3", "--json")
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)
    for r in records:
        assert {"traced_ns", "replayed_ns", "traced_spread_frac", "replayed_spread_frac", "variant", "verdict"} <= r.keys()
    storm = [r for r in records if r["item_kind"] == "collective_storm"]
    assert {r["variant"] for r in storm} == {"baseline", "bucket", "msg4x", "split4"}
    [base] = [r for r in storm if r["variant"] == "baseline"]
    for r in storm:
        assert r["status"] == "replayed" and r["replayed_group_size"] == 2 and r["busbw_bytes_per_s"] > 0
        assert sum(r["shapes"]) == sum(base["shapes"])   # the same elements per step, in other messages
    calls = {r["variant"]: len(r["shapes"]) for r in storm}
    assert calls["bucket"] == 1 and calls["msg4x"] == -(-calls["baseline"] // 4) and calls["split4"] == 4 * calls["baseline"]
    con = open_store(planted)
    try:
        for r in records:  # each record is a row (earlier tests' replays of other items stay beside them)
            assert con.execute("SELECT status, replayed_ns FROM replays WHERE item_key = ? AND variant = ? AND device = 'cpu'",
                               [r["item_key"], r["variant"]]).fetchall() == [(r["status"], r["replayed_ns"])]
        # one replay finding per replayed baseline item, naming its classification
        titles = [t for (t,) in con.execute("SELECT title FROM findings WHERE analyzer = 'replay'").fetchall()]
        assert titles and all(("in isolation" in t) or ("in the trace" in t) for t in titles)
    finally:
        con.close()


def test_report_shows_replays_next_to_the_finding_they_verify(planted):
    """The overview's replay table: the latest replay of each item and variant, by finding."""
    from bprof.dashboards.pages import overview
    from bprof.dashboards.sections import View

    assert bprof("replay", "--db", planted, "--top", "1", "--repeats", "3", "--json").returncode == 0
    con = open_store(planted, read_only=True)
    try:
        [table] = [s for s in overview.sections(con, View(1)) if s.key == "replays"]
        latest = con.execute("""SELECT count(DISTINCT (item_key, variant)) FROM replays WHERE run_id = 1""").fetchone()[0]
        linked = {t for (t,) in con.execute("SELECT finding_title FROM replays WHERE finding_title IS NOT NULL").fetchall()}
    finally:
        con.close()
    assert len(table.rows) == latest
    col = table.columns.index
    assert linked and linked <= {r[col("finding")] for r in table.rows}
    variants = [r for r in table.rows if r[col("variant")] not in ("baseline", "as traced")]
    assert variants and all(r[col("verdict")] in ("faster", "no better than noise", "slower") for r in variants
                            if r[col("replayed")].endswith("ms"))


def test_bad_input_is_one_line_with_exit_2(planted, tmp_path):
    for args, message in ((["nope"], "no run 'nope'"), (["--op", "aten::nonexistent"], "op 'aten::nonexistent' not found"),
                          (["--variant", "fp8"], "unknown variant 'fp8'"), (["--device", "tpu"], "unknown device 'tpu'")):
        done = bprof("replay", "--db", planted, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.strip().count("\n") == 0 and message in done.stderr


def test_replay_without_torch_says_so_in_one_line(tmp_path):
    from tests.test_no_torch import _without_torch

    done = _without_torch(tmp_path, "replay")
    assert done.returncode == 2
    assert done.stderr.strip() == "bprof: error: bprof replay needs torch: pip install 'bprof[capture]'"


def test_message_size_variants_keep_the_bytes_per_step():
    from bprof.replay.plan import resized_calls

    storm = [100, 100, 50, 7, 9, 1000, 3, 3, 4]
    assert resized_calls("bucket", "collective_storm", storm) == [sum(storm)]
    assert resized_calls("msg4x", "collective_storm", storm) == [257, 1015, 4]
    assert resized_calls("split4", "collective", [10]) == [3, 3, 2, 2]
    assert sum(resized_calls("split4", "collective_storm", storm[:5])) == sum(storm[:5])
    # what does not apply: a single call cannot be fused, a message under 4 elements not cut
    assert resized_calls("bucket", "collective", [10]) is None and resized_calls("msg4x", "collective", [10]) is None
    assert resized_calls("split4", "collective", [3]) is None


def test_signatures_that_cannot_be_rebuilt_say_why():
    cpu = torch.device("cpu")
    with pytest.raises(NotRebuildable, match="argument 0 is a TensorList"):
        rebuild(torch, "aten::cat", [[[1], [1]], []], ["TensorList", "Scalar"], [[[1], [1]], []], ["", "0"], cpu)
    with pytest.raises(NotRebuildable, match=r"argument 2 \(Scalar\) was recorded without its value"):
        rebuild(torch, "aten::add", [[2], [2], []], ["float", "float", "Scalar"], [[1], [1], []], ["", "", ""], cpu)
    with pytest.raises(NotRebuildable, match="has no op aten::no_such_op"):
        rebuild(torch, "aten::no_such_op", [], [], [], [], cpu)
    t = make_tensor(torch, [3, 4], [1, 3], torch.float32, cpu)
    assert t.stride() == (1, 3) and t.shape == (3, 4)
    expanded = make_tensor(torch, [5, 4], [0, 1], torch.float32, cpu)  # a broadcast view: one row in memory
    assert expanded.stride() == (0, 1) and expanded.untyped_storage().nbytes() == 16


def test_gpu_trace_ops_are_listed_with_shapes_and_dtypes(tmp_path):
    from tests.conftest import shared_trace

    trace = shared_trace("a100_ws16_rank0")  # recorded with shapes (a100_ddp_nccl_rank0 was not)
    db = tmp_path / "gpu.duckdb"
    assert bprof("ingest", trace, "--db", db, "--rank", "0").returncode == 0
    done = bprof("replay", "--db", db, "--dry-run", "--top", "40", "--json")
    assert done.returncode == 0, done.stderr
    ops = [r for r in json.loads(done.stdout) if r["item_kind"] == "op"]
    assert ops and all(r["device"] == "cuda" and r["shapes"] and r["dtypes"] for r in ops)
    assert all(r["traced_basis"].startswith("device time of its kernels") for r in ops)
    assert {r["status"] for r in ops} == {"rebuildable", "not_rebuildable"}
    assert any(r["item"].startswith("aten::mm(64x4096, 4096x2798)") for r in ops if r["status"] == "rebuildable")
    # a CPU build of torch has no cuDNN ops, and a 2023 trace kept no Scalar values: said, not skipped
    assert any("was recorded without its value" in r["reason"] for r in ops if r["status"] == "not_rebuildable")
    assert all(r["reason"] for r in ops if r["status"] == "not_rebuildable")
    con = open_store(db)
    try:
        assert con.execute("SELECT count(*) FROM replays").fetchone()[0] == 0  # a dry run stores nothing
    finally:
        con.close()


def test_verdicts_are_a_paired_sign_test_with_a_minimum_effect():
    from bprof.replay.results import FASTER, NOISE, SLOWER, judge, sign_test_p

    assert sign_test_p(7, 7) == 2 / 128 and sign_test_p(6, 7) == 2 * 8 / 128 and sign_test_p(8, 9) == 2 * 10 / 512
    base = [1.0, 1.6, 1.1, 2.0, 1.2, 1.4, 1.0]  # a drifting load: the ranges of the two overlap
    assert judge([b / 1.3 for b in base], base) == (pytest.approx(1.3), FASTER)
    assert judge([b * 1.3 for b in base], base)[1] == SLOWER
    assert judge([b / 1.02 for b in base], base)[1] == NOISE  # every pair won, by too little
    one_lost = [b / 1.3 for b in base[:-1]] + [base[-1] * 1.1]
    assert judge(one_lost, base)[1] == NOISE  # 6 of 7 is what a coin does 12.5 % of the time
    assert judge([0.5, 0.6], [1.0, 1.1, 1.2])[1] == FASTER  # unpaired: every repeat beat every one
