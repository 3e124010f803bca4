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


def test_the_rerun_of_ingest_replaces_the_partial_run_and_keeps_its_name(tmp_path, capsys):
    """The partial run of the first ingest (rank 3 failed) is removed by the ingest that completes it,
    every row of it in every table, and the complete run takes its name; a run of other files stays."""
    from bprof.store.db import open_store

    run = write_synthetic_run(tmp_path / "run")
    other = write_synthetic_run(tmp_path / "other")
    db = tmp_path / "s.duckdb"
    victim = run / "rank3.json.gz"
    good = victim.read_bytes()
    victim.write_bytes(good[:-100])
    assert main(["ingest", str(other), "--engine", "local", "--workers", "1", "--db", str(db)]) == 0
    assert main(["ingest", str(run), "--engine", "local", "--workers", "1", "--db", str(db)]) == 1
    capsys.readouterr()
    con = open_store(db, read_only=True)
    [(partial_id, partial_name, ranks)] = con.execute(
        "SELECT run_id, name, num_ranks_ingested FROM runs WHERE len(missing_ranks) > 0").fetchall()
    assert ranks == NUM_RANKS - 1 and con.execute("SELECT count(*) FROM steps WHERE run_id = ?", [partial_id]).fetchone()[0]
    con.close()

    victim.write_bytes(good)
    assert main(["ingest", str(run), "--engine", "local", "--workers", "1", "--db", str(db)]) == 0
    err = capsys.readouterr().err
    assert f"replaced the partial run {partial_name!r} (run {partial_id}, {NUM_RANKS - 1} of {NUM_RANKS} ranks)" in err
    con = open_store(db, read_only=True)
    try:
        runs = con.execute("SELECT name, num_ranks_ingested, coalesce(len(missing_ranks), 0) FROM runs "
                           "ORDER BY run_id").fetchall()
        assert runs == [("other", NUM_RANKS, 0), (partial_name, NUM_RANKS, 0)]
        tables = [t for (t,) in con.execute("""SELECT DISTINCT table_name FROM information_schema.columns
                                               WHERE column_name = 'run_id' AND table_schema = 'main'""").fetchall()]
        left = {t: con.execute(f'SELECT count(*) FROM "{t}" WHERE run_id = ?', [partial_id]).fetchone()[0] for t in tables}
        assert not any(left.values()), left
    finally:
        con.close()


def test_a_plain_ingest_of_the_folder_once_its_missing_rank_is_there_replaces_the_partial_run(tmp_path, capsys):
    from bprof.store.db import open_store

    run = write_synthetic_run(tmp_path / "run")
    db = tmp_path / "s.duckdb"
    aside = tmp_path / "rank1.json.gz"
    (run / "rank1.json.gz").rename(aside)
    assert main(["ingest", str(run), "--db", str(db)]) == 0
    aside.rename(run / "rank1.json.gz")
    assert main(["ingest", str(run), "--db", str(db)]) == 0
    assert "replaced the partial run 'run' (run 1, 3 of 4 ranks)" in capsys.readouterr().err
    con = open_store(db, read_only=True)
    try:
        assert con.execute("SELECT run_id, name, num_ranks_ingested FROM runs").fetchall() == [(2, "run", NUM_RANKS)]
    finally:
        con.close()
