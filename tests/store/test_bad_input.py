"""Every class of bad input gets one clear error naming the file, and leaves the store as it was."""

from __future__ import annotations

import gzip
import json

import pytest

from bprof.errors import DataError, UsageError
from bprof.store.ingest import IngestOptions, ingest_paths
from tests.store.tiny_traces import modern_trace, write


def snapshot(con) -> dict:
    tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()]
    return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables} | {
        "runs": con.execute("SELECT list(name ORDER BY run_id) FROM runs").fetchone()[0]}


@pytest.fixture
def good_run(store, tmp_path):
    """A store that already holds one good run, so 'unchanged' is not trivially 'empty'."""
    for rank in range(2):
        write(tmp_path / "good" / f"rank{rank}.json.gz", modern_trace(rank))
    ingest_paths(store, [tmp_path / "good"])
    return snapshot(store)


def run_dir(tmp_path, name="bad"):
    d = tmp_path / name
    write(d / "rank0.json.gz", modern_trace(0))
    return d


def test_truncated_gzip(store, tmp_path, good_run):
    d = run_dir(tmp_path)
    whole = gzip.compress(json.dumps(modern_trace(1)).encode())
    (d / "rank1.json.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match=r"rank1\.json\.gz: truncated gzip stream"):
        ingest_paths(store, [d])
    assert snapshot(store) == good_run


def test_invalid_json_names_the_byte(store, tmp_path, good_run):
    d = run_dir(tmp_path)
    text = json.dumps(modern_trace(1))
    where = text.index('"name": "aten::mm"')
    broken = text[:where] + '"name": aten::mm' + text[where + len('"name": "aten::mm"'):]
    (d / "rank1.json").write_text(broken)
    with pytest.raises(DataError) as err:
        ingest_paths(store, [d])
    message = str(err.value)
    assert message.startswith(f"{d / 'rank1.json'}: invalid JSON at byte ")
    byte = int(message.split("at byte ")[1].split()[0])
    assert abs(byte - (where + len('"name": '))) <= 2, message
    assert snapshot(store) == good_run


def test_truncated_plain_json(store, tmp_path, good_run):
    d = run_dir(tmp_path)
    text = json.dumps(modern_trace(1))
    (d / "rank1.json").write_text(text[: len(text) * 2 // 3])
    with pytest.raises(DataError, match=r"rank1\.json: truncated or malformed JSON: the traceEvents array .* never closed"):
        ingest_paths(store, [d])
    assert snapshot(store) == good_run


def test_no_events(store, tmp_path, good_run):
    d = run_dir(tmp_path)
    empty = modern_trace(1)
    empty["traceEvents"] = []
    write(d / "rank1.json.gz", empty)
    with pytest.raises(DataError, match=r"rank1\.json\.gz: the trace has no events"):
        ingest_paths(store, [d])
    assert snapshot(store) == good_run


def test_a_stray_json_beside_the_rank_traces_is_skipped_with_a_warning_naming_it(store, tmp_path, good_run):
    """A config or sidecar .json in the run directory made the whole ingest fail ("no traceEvents
    array"): it is skipped, and only it."""
    d = run_dir(tmp_path)
    write(d / "rank1.json.gz", modern_trace(1))
    (d / "config.json").write_text(json.dumps({"model": {"layers": 2}, "lr": 0.1}))
    [r] = ingest_paths(store, [d])
    assert r.warnings == [f"{d / 'config.json'}: skipped, not a trace (a JSON object without a traceEvents array)"]
    assert (r.num_ranks, r.created) == (2, True)
    assert store.execute("SELECT list(trace_path ORDER BY rank) FROM ranks WHERE run_id = ?", [r.run_id]).fetchone()[0] \
        == [str(d / "rank0.json.gz"), str(d / "rank1.json.gz")]


def test_a_file_named_on_its_own_that_is_no_trace_stays_an_error(store, tmp_path, good_run):
    path = tmp_path / "rank1.json"
    path.write_text(json.dumps({"schemaVersion": 1, "other": [1, 2]}))
    with pytest.raises(DataError, match=r"rank1\.json: no traceEvents array") as err:
        ingest_paths(store, [path])
    assert err.value.exit_code == 3
    assert snapshot(store) == good_run
    # beside a trace named on its own too: still an error, nothing ingested
    with pytest.raises(DataError, match=r"rank1\.json: no traceEvents array"):
        ingest_paths(store, [run_dir(tmp_path) / "rank0.json.gz", path])
    assert snapshot(store) == good_run


def test_a_directory_without_any_trace_is_an_error(store, tmp_path, good_run):
    d = tmp_path / "configs"
    d.mkdir()
    (d / "a.json").write_text("{}")
    (d / "b.json").write_text(json.dumps({"x": 1}))
    with pytest.raises(DataError, match=r"no trace among the files: .*a\.json: skipped, .*b\.json: skipped"):
        ingest_paths(store, [d])
    assert snapshot(store) == good_run


def test_duplicate_rank(store, tmp_path, good_run):
    d = run_dir(tmp_path)
    write(d / "copy_of_rank0.json.gz", modern_trace(0, steps=(2, 3)))
    with pytest.raises(DataError, match=r"duplicate rank 0 in one run"):
        ingest_paths(store, [d])
    assert snapshot(store) == good_run


def test_missing_rank_asks_for_rank(store, tmp_path, good_run):
    trace = modern_trace(0)
    del trace["distributedInfo"]
    f = write(tmp_path / "worker.json.gz", trace)
    with pytest.raises(DataError, match=r"worker\.json\.gz: cannot tell its rank .* pass --rank"):
        ingest_paths(store, [f])
    assert snapshot(store) == good_run
    [result] = ingest_paths(store, [f], IngestOptions(rank=5))
    assert store.execute("SELECT rank FROM ranks WHERE run_id = ?", [result.run_id]).fetchone()[0] == 5


def test_missing_path_is_a_usage_error(store, tmp_path, good_run):
    with pytest.raises(UsageError, match="no such file or directory"):
        ingest_paths(store, [tmp_path / "nope"])
    assert snapshot(store) == good_run


def test_empty_file(store, tmp_path, good_run):
    d = run_dir(tmp_path)
    (d / "rank1.json").write_text("")
    with pytest.raises(DataError, match=r"rank1\.json: the file is empty"):
        ingest_paths(store, [d])
    assert snapshot(store) == good_run


def test_invalid_json_in_a_later_part_names_the_source_byte(store, tmp_path, good_run, monkeypatch):
    """A large trace is cut into several arrays; the byte reported is still the source's."""
    from bprof.store import kineto_file

    monkeypatch.setattr(kineto_file, "PART_BYTES", 1500)
    d = run_dir(tmp_path)
    text = json.dumps(modern_trace(1, steps=tuple(range(2, 40))), indent=1)
    where = text.rindex('"name": "aten::mm"')
    broken = text[:where] + '"name": aten::mm' + text[where + len('"name": "aten::mm"'):]
    (d / "rank1.json").write_text(broken)
    bad_byte = where + len('"name": ')
    with pytest.raises(DataError, match=rf"rank1\.json: invalid JSON at byte {bad_byte} "):
        ingest_paths(store, [d])
    assert snapshot(store) == good_run
