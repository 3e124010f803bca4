"""`bprof reduce DIR` on the local engine: a truncated trace fails alone (one line naming it, exit 1),
the others are written; the rerun reduces only that trace, `--force` all of them."""

from __future__ import annotations

from bprof.cli.main import main
from tests.scale.runs import NUM_RANKS, write_synthetic_run


def test_a_failed_trace_costs_only_itself_and_the_rerun_redoes_only_it(tmp_path, capsys):
    run = write_synthetic_run(tmp_path / "run")
    victim = run / "rank3.json.gz"
    good = victim.read_bytes()
    victim.write_bytes(good[:-100])
    assert main(["reduce", str(run), "--workers", "1"]) == 1
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [
        f"bprof: error: {victim}: truncated gzip stream (the file ends before the compressed data does)"]
    assert out.splitlines()[-1] == f"{NUM_RANKS - 1} reduced, 0 kept, 1 failed of {NUM_RANKS} traces"
    assert sorted(p.name for p in run.glob("*.reduced")) == [f"rank{r}.reduced" for r in range(NUM_RANKS - 1)]
    assert not list(run.glob("*.tmp-*"))  # no half-written output left behind

    victim.write_bytes(good)
    assert main(["reduce", str(run), "--workers", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"1 reduced, {NUM_RANKS - 1} kept, 0 failed of {NUM_RANKS} traces"
    assert out[NUM_RANKS - 1].startswith(f"reduced rank 3 of {victim} into {run / 'rank3.reduced'} in ")
    assert main(["reduce", str(run), "--workers", "1", "--force"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{NUM_RANKS} reduced, 0 kept, 0 failed of {NUM_RANKS} traces"
