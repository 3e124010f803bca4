"""torch.compile'd training steps under torchrun and `bprof record`: 2 CPU ranks (gloo), an MLP in
DDP compiled by inductor (C++ kernels, g++), against the same program without torch.compile."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.launchers.recording import (analyze, assert_collectives_identified, assert_every_rank_recorded, free_port,
                                       rank_metas, record, store)

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("compiled_train.py")
# executed FLOPs of one step of compiled_train.py's MLP (64 -> 256 -> 256 -> 32, batch 32): 2*B*sum(K*N)
# forward, twice that backward less the input gradient of the first layer, which nothing needs
FORWARD_FLOPS = 2 * 32 * (64 * 256 + 256 * 256 + 256 * 32)
STEP_FLOPS = 3 * FORWARD_FLOPS - 2 * 32 * 64 * 256


def record_mlp(tmp_path: Path, *extra: str):
    done = record(tmp_path, [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
                             "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(SCRIPT), "--steps", "6",
                             *extra],
                  env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),  # compiled here, not from a cache
                       "TORCHINDUCTOR_COMPILE_THREADS": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def matmuls(con, run_id) -> dict:
    """(rank, step) -> sorted (op, operand shapes) of the matmul calls; inductor calls the `out=`
    variant, whose last operand (the output) is dropped to compare with eager's."""
    found: dict = {}
    for rank, step, name, dims in con.execute(
            "SELECT rank, step, name, args->>'Input Dims' FROM events WHERE run_id = ? AND kind = 'cpu_op' "
            "AND name IN ('aten::mm', 'aten::addmm')", [run_id]).fetchall():
        dims = json.loads(dims)
        found.setdefault((rank, step), []).append((name, dims[:2] if name == "aten::mm" else dims[:3]))
    return {k: sorted(map(str, v)) for k, v in found.items()}


def flops(con, run_id) -> dict:
    return dict(((r, s), f) for r, s, f in con.execute(
        "SELECT rank, step, executed_flops FROM kernels_flops WHERE run_id = ?", [run_id]).fetchall())


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="inductor's CPU backend compiles C++ kernels and no C++ compiler (g++, c++) is on PATH")
def test_compiled_steps_keep_windows_collectives_shapes_and_flops(tmp_path):
    compiled, eager = tmp_path / "compiled", tmp_path / "eager"
    compiled.mkdir()
    eager.mkdir()
    done = record_mlp(compiled)
    record_mlp(eager, "--eager")

    # every rank, steps 2 and 3, and only the two trainers: inductor's compile workers (rank 0's
    # sidecar and its forked workers, RANK=0 in their environment) are no rank
    con, run_id = assert_every_rank_recorded(compiled, 2)
    trainers = {int(r): int(pid) for r, pid in re.findall(r"rank (\d) of 2 done \(compiled\), pid (\d+)", done.stdout)}
    workers = [int(p) for p in re.findall(r"\d+", re.search(r"compile workers \[([\d, ]+)\]", done.stdout).group(1))]
    assert len(workers) >= 2
    assert {r: m["pid"] for r, m in rank_metas(compiled).items()} == trainers
    assert dict(con.execute("SELECT rank, pid FROM ranks WHERE run_id = ?", [run_id]).fetchall()) == trainers
    # the steps ran compiled code: inductor's forward and backward in every step of every rank
    compiled_calls = con.execute("""
        SELECT rank, step, list(DISTINCT name ORDER BY name) FROM events WHERE run_id = ?
          AND name IN ('CompiledFunction', 'CompiledFunctionBackward') GROUP BY ALL ORDER BY ALL""", [run_id]).fetchall()
    assert compiled_calls == [(r, s, ["CompiledFunction", "CompiledFunctionBackward"]) for r in (0, 1) for s in (2, 3)]
    assert "all_reduce" in assert_collectives_identified(con, run_id, 2)

    con_e, run_e = assert_every_rank_recorded(eager, 2)
    assert con_e.execute("SELECT count(*) FROM events WHERE run_id = ? AND name LIKE 'Compiled%'", [run_e]).fetchone()[0] == 0
    # the same matmuls with the same shapes, compiled or not, and the same executed FLOPs
    assert matmuls(con, run_id) == matmuls(con_e, run_e)
    assert len(matmuls(con, run_id)) == 4 and all(len(v) == 8 for v in matmuls(con, run_id).values())
    con.close()
    con_e.close()
    assert sorted(r["rank"] for r in analyze(compiled)["ranks"]) == [0, 1]
    assert sorted(r["rank"] for r in analyze(eager)["ranks"]) == [0, 1]
    with store(compiled) as con, store(eager) as con_e:
        compiled_flops = flops(con, con.execute("SELECT run_id FROM runs").fetchone()[0])
        eager_flops = flops(con_e, con_e.execute("SELECT run_id FROM runs").fetchone()[0])
    assert compiled_flops == eager_flops == {(r, s): STEP_FLOPS for r in (0, 1) for s in (2, 3)}
