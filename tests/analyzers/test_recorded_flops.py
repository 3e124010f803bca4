"""HFU and MFU on real recordings of examples/train_gpt.py (torchrun, 2 CPU ranks, gloo).

With --recompute every block's forward runs twice, so HFU (executed FLOPs from recorded shapes)
must exceed MFU (declared model FLOPs) by about the recompute share the trainer itself computes.
"""

import json
import subprocess
import sys

import pytest

from tests.profiler.test_record import TRAINER, record

pytestmark = pytest.mark.slow


def _analyze(tmp_path) -> dict:
    # any fixed peak will do: HFU / MFU does not depend on it
    done = subprocess.run([sys.executable, "-m", "bprof.cli.main", "analyze", "--db", str(tmp_path / "s.duckdb"),
                           "--json", "--peak-tflops", "0.1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("recompute", [False, True], ids=["plain", "recompute"])
def test_hfu_over_mfu_follows_the_recompute_share(tmp_path, recompute):
    args = ["--tp", "1", "--dp", "2", "--steps", "8", "--layers", "2"] + (["--recompute"] if recompute else [])
    done = record(tmp_path, "--steps", "3:7", "--name", "flops", nproc=2, script=TRAINER, script_args=args)
    assert done.returncode == 0, done.stderr[-3000:]
    out = _analyze(tmp_path)
    m = {k: v["value"] for k, v in out["metrics"].items()}
    declared_ratio = _declared_ratio(tmp_path)
    assert m["flop_coverage_frac"] >= 0.9
    assert m["mfu_frac"] and m["hfu_frac"]
    measured_ratio = m["hfu_frac"] / m["mfu_frac"]
    print(f"recompute={recompute}: HFU/MFU measured {measured_ratio:.3f}, declared {declared_ratio:.3f}")
    # traced FLOPs count matmuls and attention only (no embedding or elementwise work), a few % under
    # the 6·N·tokens formula: measured 0.96 of it on this model without recompute
    assert measured_ratio == pytest.approx(declared_ratio, rel=0.08)
    if recompute:
        assert declared_ratio > 1.2 and measured_ratio > 1.15
    else:
        _no_finding_claims_more_than_noise(tmp_path, out)


def _no_finding_claims_more_than_noise(tmp_path, out: dict) -> None:
    """An unmodified run: every cost claimed, except communication that is really exposed (this trainer
    all-reduces gradients after the backward) and a straggler, stays within the run's own step-to-step
    noise. Two ranks sharing this 2-core machine are not always equal: in 1 of 3 unmodified runs one
    rank computed 20-25 % more in every step (contention), and bprof rightly calls it a straggler; so a
    straggler claim must be backed by that rank's measured extra compute, not by noise."""
    import duckdb

    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    noise_ns, step_ns = con.execute("""
        SELECT median(spread), median(step) FROM (
            SELECT rank, max(dur_ns) - min(dur_ns) AS spread, median(dur_ns) AS step FROM timeline_spans GROUP BY rank)""").fetchone()
    allowed = max(noise_ns, 0.02 * step_ns)
    claims = [(f["title"], f["lost_ns"]) for f in out["findings"]
              if f["lost_ns"] is not None and not f["title"].startswith("Exposed ") and f["analyzer"] != "stragglers"]
    assert all(lost <= allowed for _, lost in claims), (allowed, claims)
    assert not [f for f in out["findings"] if f["analyzer"] == "phases"]  # no data-wait claim
    compute = dict(con.execute("SELECT rank, compute_ns FROM stragglers_ranks").fetchall())
    for f in out["findings"]:
        if f["analyzer"] == "stragglers":
            [rank] = f["evidence"]["ranks"]
            extra_ns = compute[rank] - min(v for r, v in compute.items() if r != rank)
            # lost is a median of per-step gains, extra_ns a difference of per-rank medians: under load
            # they part by more than the 25 % seen on a quiet machine (seen in CI: 15.5 against 10.8 ms)
            assert f["evidence"]["cause"] == "device" and f["lost_ns"] <= 1.5 * extra_ns, (f, compute)


def _declared_ratio(tmp_path) -> float:
    import duckdb

    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    model = json.loads(con.execute("SELECT metadata FROM runs").fetchone()[0])["bprof_model"]
    return model["executed_flops_per_step"] / model["model_flops_per_step"]
