"""examples/train_gpt.py: FLOPs by hand, and real torchrun jobs on CPU ranks (gloo) per layout.

Each torchrun launch is a module fixture shared by several tests, so the slow tier starts eight jobs.
Loss trajectories are compared across layouts: weights and data do not depend on the layout, so
TP, PP (all three schedules), DP and recompute must all compute the same function.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import upstream_exit_abort

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_gpt.py"
STEPS = 20  # enough for the loss to fall from ~6.3 to ~3.5 on the default model
MEGATRON = ("TENSOR_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP")

torch = pytest.importorskip("torch")


def load_trainer():
    spec = importlib.util.spec_from_file_location("train_gpt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_gpt"] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


tg = load_trainer()


# ------------------------------------------------------------------------------------------------
# Fast: FLOPs and shapes against hand computation


def test_model_flops_per_step_matches_hand_count():
    args = tg.parse_args(["--dp", "2"])  # hidden 128, 4 layers, seq 64, vocab 512, batch 4, 4 micro
    h = 128
    per_block = 12 * h * h + 13 * h  # qkv 3h²+3h, proj h²+h, fc1 4h²+4h, fc2 4h²+h, 2 norms 4h
    n = 4 * per_block + 2 * h + h * 512  # blocks + final norm + untied head; embeddings excluded
    assert n == 858_880
    tokens = 4 * 4 * 2 * 64  # batch x microbatches x dp x seq
    expected = 6 * n * tokens + 12 * 4 * h * 64 * tokens
    assert expected == 11_359_223_808
    assert tg.model_flops_per_step(args) == expected
    flops = tg.flops_per_step(args)
    assert flops["executed_flops_per_step"] == expected
    assert flops["tokens_per_step"] == 2048
    assert flops["params"] == n + 512 * h + 64 * h


def test_recompute_adds_one_forward_of_the_blocks():
    plain = tg.flops_per_step(tg.parse_args([]))
    rec = tg.flops_per_step(tg.parse_args(["--recompute"]))
    tokens = 4 * 4 * 64
    extra = 2 * 4 * (12 * 128 * 128 + 13 * 128) * tokens + 4 * 4 * 128 * 64 * tokens
    assert rec["model_flops_per_step"] == plain["model_flops_per_step"]
    assert rec["executed_flops_per_step"] - rec["model_flops_per_step"] == extra


@pytest.mark.parametrize(
    ("flags", "hidden", "per_stage"),
    [
        ([], 128, (4,)),
        (["--odd-shapes"], 132, (4,)),
        (["--odd-shapes", "--hidden", "96", "--heads", "8"], 96, (4,)),  # 96 % 64 != 0: kept
        (["--odd-shapes", "--hidden", "256", "--heads", "16"], 272, (4,)),  # 259 -> 272
        (["--pp", "2", "--stage-imbalance", "2"], 128, (2, 4)),
        (["--pp", "4", "--stage-imbalance", "2.5"], 128, (1, 1, 1, 3)),  # 2.5 rounds half up
        (["--pp", "2", "--stage-imbalance", "0.1"], 128, (2, 1)),  # never below one layer
        (["--pp", "2", "--schedule", "interleaved", "--chunks", "2"], 128, (2, 2)),
        # each of the last stage's 2 chunks gets 3 x 1 layer
        (["--pp", "2", "--schedule", "interleaved", "--chunks", "2", "--stage-imbalance", "3"], 128, (2, 6)),
    ],
)
def test_model_shape(flags, hidden, per_stage):
    shape = tg.model_shape(tg.parse_args(flags))
    assert (shape.hidden, shape.layers_per_stage) == (hidden, per_stage)
    assert shape.hidden % shape.heads == 0


def test_interleaved_chunks_take_the_layers_round_robin():
    # 8 layers in pp x chunks = 4 model chunks of 2; model chunk c lives on stage c % pp
    shape = tg.model_shape(tg.parse_args(["--pp", "2", "--schedule", "interleaved", "--chunks", "2", "--layers", "8"]))
    assert [list(shape.chunk_layers(c)) for c in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    shape = tg.model_shape(tg.parse_args(["--pp", "2", "--schedule", "interleaved", "--chunks", "2",
                                          "--stage-imbalance", "2"]))
    assert [list(shape.chunk_layers(c)) for c in range(4)] == [[0], [1, 2], [3], [4, 5]]
    assert tg.model_summary(tg.parse_args(["--pp", "2", "--schedule", "interleaved", "--chunks", "2"]))["chunks"] == 2


def test_flops_follow_the_built_layers_and_width():
    args = tg.parse_args(["--pp", "2", "--stage-imbalance", "2", "--odd-shapes"])
    h, layers, tokens = 132, 6, 4 * 4 * 64
    n = layers * (12 * h * h + 13 * h) + 2 * h + h * 512
    assert tg.model_flops_per_step(args) == 6 * n * tokens + 12 * layers * h * 64 * tokens


def test_param_count_formula_matches_the_built_model(monkeypatch):
    """The analytic N mirrors the modules: build every stage of a world of one and count."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    args = tg.parse_args(["--odd-shapes", "--device", "cpu"])
    par = tg.init_parallel(args)
    try:
        model = tg.Stage(tg.model_shape(args), par, args)
        assert sum(p.numel() for p in model.parameters()) == tg.flops_per_step(args)["params"]
    finally:
        torch.distributed.destroy_process_group()


def test_help_documents_every_fault():
    text = tg.build_parser().format_help()
    for flag in ("--slow-rank", "--slow-ms", "--dataloader-stall-ms", "--host-sync",
                 "--stage-imbalance", "--no-bucket", "--odd-shapes", "--recompute"):
        assert flag in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tp", "2"], "WORLD_SIZE is 1"),
        (["--heads", "3", "--tp", "2"], "--heads 3 must be divisible by --tp 2"),
        (["--stage-imbalance", "2"], "--stage-imbalance needs --pp >= 2"),
        (["--chunks", "2"], "--chunks needs --schedule interleaved"),
        (["--pp", "2", "--schedule", "interleaved"], "needs --pp >= 2 and --chunks >= 2"),
        (["--pp", "2", "--schedule", "interleaved", "--chunks", "2", "--microbatches", "3"],
         "--microbatches divisible by --pp 2"),
        (["--pp", "2", "--schedule", "interleaved", "--chunks", "4"], "divisible by --pp x --chunks = 8"),
    ],
)
def test_bad_layouts_fail_with_a_clear_message(flags, message):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, str(SCRIPT), *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------
# Slow: real torchrun jobs


@dataclasses.dataclass
class Run:
    stdout: str
    rows: list[dict]
    profile_dir: Path

    def tagged(self, tag: str) -> list[dict]:
        prefix = f"bprof-{tag}: "
        return [json.loads(line[len(prefix):]) for line in self.stdout.splitlines()
                if line.startswith(prefix)]

    @property
    def model(self) -> dict:
        (model,) = self.tagged("model")
        return model

    @property
    def losses(self) -> list[float]:
        return [row["loss"] for row in self.tagged("step")]

    def config(self, rank: int) -> dict:
        (row,) = [r for r in self.rows if r["kind"] == "config" and r["rank"] == rank]
        return row

    def steps(self, rank: int) -> list[dict]:
        rows = sorted((r for r in self.rows if r["kind"] == "step" and r["rank"] == rank),
                      key=lambda r: r["step"])
        assert [r["step"] for r in rows] == list(range(len(rows)))
        return rows

    def median(self, rank: int, key: str) -> float:
        return statistics.median(r[key] for r in self.steps(rank)[1:])  # step 0 warms up

    def groups(self, rank: int) -> dict[str, list[int]]:
        return {g["pg_desc"]: g["ranks"] for g in self.config(rank)["process_groups"]}


def torchrun(tmp_path: Path, nproc: int, *flags: str, timeout: int = 240) -> Run:
    """Launch the trainer under torchrun; every run logs JSON lines, `--profile-steps` adds traces."""
    log, traces = tmp_path / "log.jsonl", tmp_path / "traces"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", str(SCRIPT), "--log-json", str(log), *flags]
    if "--profile-steps" in flags:
        cmd += ["--profile-dir", str(traces)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if upstream_exit_abort(proc):  # torch's abort at exit after profiling, not the trainer's (conftest)
        log.unlink(missing_ok=True)
        shutil.rmtree(traces, ignore_errors=True)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]  # fails on torn lines
    return Run(proc.stdout, rows, traces)


def assert_trains(run: Run):
    losses = run.losses
    assert len(losses) == STEPS
    assert all(math.isfinite(x) for x in losses)
    assert losses[0] > 6.0  # about ln(512) at initialisation
    assert statistics.mean(losses[-3:]) < losses[0] - 1.5, losses


def load_trace(run: Run, rank: int) -> dict:
    return _load_trace(run.profile_dir / f"rank{rank}.json.gz")


@functools.cache
def _load_trace(path: Path) -> dict:
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # gzip
    with gzip.open(path, "rt") as f:
        return json.load(f)


def count_named(trace: dict, name: str) -> int:
    return sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("name") == name)


@pytest.fixture(scope="module")
def tp2_dp2(tmp_path_factory):
    return torchrun(tmp_path_factory.mktemp("tp2_dp2"), 4, "--tp", "2", "--dp", "2",
                    "--steps", str(STEPS))


@pytest.fixture(scope="module")
def pp2_dp2_faults(tmp_path_factory):
    return torchrun(tmp_path_factory.mktemp("pp2_dp2"), 4, "--pp", "2", "--dp", "2",
                    "--schedule", "gpipe", "--steps", str(STEPS), "--slow-rank", "1",
                    "--slow-ms", "60", "--no-bucket", "--dataloader-stall-ms", "10")


@pytest.fixture(scope="module")
def pp4(tmp_path_factory):
    return torchrun(tmp_path_factory.mktemp("pp4"), 4, "--pp", "4", "--steps", str(STEPS))


@pytest.fixture(scope="module")
def pp2_interleaved(tmp_path_factory):
    return torchrun(tmp_path_factory.mktemp("pp2_interleaved"), 2, "--pp", "2", "--schedule", "interleaved",
                    "--chunks", "2", "--steps", str(STEPS))


SMALL = ("--layers", "8", "--hidden", "64", "--microbatches", "8", "--steps", "4")


@pytest.fixture(scope="module")
def small_pp1(tmp_path_factory):
    return torchrun(tmp_path_factory.mktemp("small_pp1"), 1, *SMALL)


@pytest.fixture(scope="module")
def small_pp4_interleaved(tmp_path_factory):
    return torchrun(tmp_path_factory.mktemp("small_pp4_il"), 4, "--pp", "4", "--schedule", "interleaved",
                    "--chunks", "2", *SMALL)


@pytest.fixture(scope="module")
def tp2_pp2_profiled(tmp_path_factory):
    return torchrun(tmp_path_factory.mktemp("tp2_pp2"), 4, "--tp", "2", "--pp", "2",
                    "--steps", str(STEPS), "--recompute", "--host-sync", "--profile-steps", "2:4")


@pytest.fixture(scope="module")
def pp2_odd(tmp_path_factory):
    return torchrun(tmp_path_factory.mktemp("pp2_odd"), 2, "--pp", "2", "--steps", "8",
                    "--odd-shapes", "--stage-imbalance", "2", "--dtype", "bf16",
                    "--profile-steps", "1:2")


@pytest.mark.slow
def test_tp2_dp2_trains_with_megatron_groups(tp2_dp2):
    assert_trains(tp2_dp2)
    model = tp2_dp2.model
    assert (model["tp"], model["pp"], model["dp"], model["microbatches"]) == (2, 1, 2, 4)
    assert model["model_flops_per_step"] == 11_359_223_808
    for key in ("executed_flops_per_step", "tokens_per_step", "params", "layers", "hidden",
                "heads", "seq", "dtype", "recompute"):
        assert key in model
    # rank = pp_rank*(dp*tp) + dp_rank*tp + tp_rank
    expected = {0: ([0, 1], [0, 2], [0]), 1: ([0, 1], [1, 3], [1]),
                2: ([2, 3], [0, 2], [2]), 3: ([2, 3], [1, 3], [3])}
    for rank, ranks in expected.items():
        groups = tp2_dp2.groups(rank)
        assert [groups[desc] for desc in MEGATRON] == list(ranks)


@pytest.mark.slow
def test_tp2_dp2_buckets_all_gradients_into_one_allreduce(tp2_dp2):
    for rank in range(4):
        assert {r["dp_allreduce_calls"] for r in tp2_dp2.steps(rank)} == {1}


@pytest.mark.slow
def test_pp2_dp2_gpipe_trains_the_same_function_as_tp2_dp2(pp2_dp2_faults, tp2_dp2):
    assert_trains(pp2_dp2_faults)
    assert pp2_dp2_faults.losses == pytest.approx(tp2_dp2.losses, abs=2e-3)
    assert pp2_dp2_faults.groups(1)["PIPELINE_MODEL_PARALLEL_GROUP"] == [1, 3]
    assert pp2_dp2_faults.groups(1)["DATA_PARALLEL_GROUP"] == [0, 1]
    assert pp2_dp2_faults.groups(3)["TENSOR_MODEL_PARALLEL_GROUP"] == [3]


@pytest.mark.slow
def test_slow_rank_slows_only_its_own_forward(pp2_dp2_faults):
    run = pp2_dp2_faults
    # Ranks 0 and 1 run the same stage on the same shapes; only rank 1 carries the delay.
    delta_ms = run.median(1, "forward_ms") - run.median(0, "forward_ms")
    assert 30 < delta_ms < 150, delta_ms
    assert 30 < run.median(1, "slow_rank_ms") < 120
    for rank in (0, 2, 3):
        assert {r["slow_rank_ms"] for r in run.steps(rank)} == {0.0}


@pytest.mark.slow
def test_dataloader_stall_sleeps_in_every_fetch(pp2_dp2_faults, tp2_dp2):
    for rank in range(4):  # with pp=2 every rank is a first or last stage and fetches 4 batches
        assert min(r["dataloader_ms"] for r in pp2_dp2_faults.steps(rank)) >= 4 * 10
        assert tp2_dp2.median(rank, "dataloader_ms") < 20


@pytest.mark.slow
def test_no_bucket_allreduces_each_parameter(pp2_dp2_faults):
    for rank in range(4):
        n = pp2_dp2_faults.config(rank)["num_param_tensors"]
        assert n > 20
        assert {r["dp_allreduce_calls"] for r in pp2_dp2_faults.steps(rank)} == {n}


@pytest.mark.slow
def test_pp4_1f1b_trains(pp4):
    assert_trains(pp4)
    assert pp4.groups(2)["PIPELINE_MODEL_PARALLEL_GROUP"] == [0, 1, 2, 3]
    assert [pp4.config(r)["layer_ids"] for r in range(4)] == [[0], [1], [2], [3]]
    assert pp4.tagged("summary")[0]["rank"] == 3  # the last stage reports


@pytest.mark.slow
def test_pp2_interleaved_trains_the_same_function_as_pp4(pp2_interleaved, pp4):
    run = pp2_interleaved
    assert_trains(run)
    assert run.losses == pytest.approx(pp4.losses, abs=2e-3)
    assert (run.model["schedule"], run.model["chunks"], run.model["pp"]) == ("interleaved", 2, 2)
    # model chunks 0..3 of one layer each, round robin over the 2 stages
    assert [run.config(r)["layer_ids"] for r in (0, 1)] == [[0, 2], [1, 3]]
    # per stage and step: (2 chunks x 2 directions - 1) x 4 micro-batches sends, as many receives
    for rank in (0, 1):
        assert {r["pp_p2p_calls"] for r in run.steps(rank)} == {2 * 3 * 4}


@pytest.mark.slow
def test_pp4_interleaved_with_a_steady_phase_matches_one_stage(small_pp4_interleaved, small_pp1):
    # m = 8 > p = 4: warm-up, steady one-forward-one-backward and cool-down phases all run; the ring
    # crosses from stage 3 back to stage 0 for the second chunk
    assert small_pp4_interleaved.losses == pytest.approx(small_pp1.losses, abs=2e-3)
    assert [small_pp4_interleaved.config(r)["layer_ids"] for r in range(4)] == [[r, r + 4] for r in range(4)]


@pytest.mark.slow
def test_recompute_and_tp_match_the_pipeline_only_run(tp2_pp2_profiled, pp4):
    run = tp2_pp2_profiled
    assert_trains(run)
    assert run.losses == pytest.approx(pp4.losses, abs=2e-3)
    assert run.model["executed_flops_per_step"] > run.model["model_flops_per_step"]


@pytest.mark.slow
def test_profile_dir_writes_a_trace_per_rank(tp2_pp2_profiled):
    run = tp2_pp2_profiled
    for rank in range(4):
        trace = load_trace(run, rank)
        steps = sorted(e["name"] for e in trace["traceEvents"]
                       if e.get("name", "").startswith("ProfilerStep#"))
        assert steps == ["ProfilerStep#2", "ProfilerStep#3"]
        assert trace["bprof_model"] == run.model
        descs = {c["pg_desc"] for c in trace["distributedInfo"]["pg_config"]}
        assert set(MEGATRON) <= descs
        for name in ("bprof/forward", "bprof/backward", "bprof/optimizer", "bprof/dataloader",
                     "bprof/pp_recv"):
            assert count_named(trace, name) > 0, name


@pytest.mark.slow
def test_recompute_runs_every_block_forward_twice(tp2_pp2_profiled):
    for rank in range(4):
        trace = load_trace(tp2_pp2_profiled, rank)
        layers = len(tp2_pp2_profiled.config(rank)["layer_ids"])
        # 2 profiled steps x 4 micro-batches x layers, once in forward and once recomputed
        assert count_named(trace, "aten::gelu") == 2 * 4 * layers * 2


@pytest.mark.slow
def test_host_sync_calls_item_after_every_layer(tp2_pp2_profiled):
    for rank in range(4):
        trace = load_trace(tp2_pp2_profiled, rank)
        layers = len(tp2_pp2_profiled.config(rank)["layer_ids"])
        ranges = [e for e in trace["traceEvents"]
                  if e.get("ph") == "X" and e.get("name") == "bprof/host_sync"]
        items = [e for e in trace["traceEvents"]
                 if e.get("ph") == "X" and e.get("name") == "aten::item"]
        assert len(ranges) == 2 * 4 * layers
        for r in ranges:  # each range holds a real .item() on the same thread
            assert any(i["tid"] == r["tid"] and r["ts"] <= i["ts"] <= r["ts"] + r["dur"]
                       for i in items)


@pytest.mark.slow
def test_odd_shapes_stage_imbalance_and_bf16(pp2_odd):
    run = pp2_odd
    model = run.model
    assert (model["hidden"], model["layers"], model["layers_per_stage"]) == (132, 6, [2, 4])
    assert [run.config(r)["layer_ids"] for r in (0, 1)] == [[0, 1], [2, 3, 4, 5]]
    losses = run.losses
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    # The heavier last stage spends clearly longer in forward.
    assert run.median(1, "forward_ms") > 1.3 * run.median(0, "forward_ms")
    trace = load_trace(run, 0)
    matmuls = [e["args"] for e in trace["traceEvents"]
               if e.get("name") in ("aten::mm", "aten::addmm") and "Input Dims" in e.get("args", {})]
    assert any(132 in dims for a in matmuls for dims in a["Input Dims"])
    assert any("c10::BFloat16" in a["Input type"] for a in matmuls)
