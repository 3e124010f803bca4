"""`bprof export --perfetto`: one step of chosen ranks as a Chrome trace on the aligned clock, with
arrows between matched collectives, that re-ingests into bprof with the same collectives matched.
Real runs: the session's recorded 4-rank gloo run and synthetic 8-GPU NCCL run (conftest.py)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.dashboards.perfetto import export_perfetto
from bprof.errors import UsageError
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths
from tests.store.tiny_traces import modern_trace, write

ROOT = Path(__file__).resolve().parents[2]
EVIL = 'q"uo\'te \\back\\slash <script>alert(1)</script> ünï©ødé 日本 \u2028 \x01'


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bprof.cli.main", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


def load(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)  # the stdlib parser: plain JSON


def reingest(path: Path, tmp_path: Path):
    """Ingest an export into a new store and analyse it as `bprof analyze` does; (con, run_id)."""
    con = open_store(tmp_path / "again.duckdb")
    [result] = ingest_paths(con, [path], IngestOptions(work_dir=tmp_path))
    analysis.analyze_run(con, result.run_id, Options())
    return con, result.run_id


def instances(con, run_id: int, step: int | None = None) -> list[tuple]:
    return con.execute("""SELECT op, pg_name, seq, src_rank, dst_rank, status, list(m.rank ORDER BY m.rank)
                          FROM match_instances i JOIN match_members m USING (run_id, instance_id)
                          WHERE run_id = ? AND (? IS NULL OR i.step = ?) GROUP BY ALL ORDER BY ALL""",
                       [run_id, step, step]).fetchall()


def flows(trace: dict) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for e in trace["traceEvents"]:
        if e.get("cat") == "bprof.match":
            out.setdefault(e["id"], []).append(e)
    return out


def median_step(con, run_id: int, ranks: list[int]) -> int:
    """The default step, computed here the slow way: the lower median of the job's step time."""
    spans = con.execute("SELECT step, rank, dur_ns FROM timeline_spans WHERE run_id = ?", [run_id]).fetchall()
    steps = sorted({s for s, _, _ in spans})
    job = sorted((max(d for s2, r, d in spans if s2 == s and r in ranks), s) for s in steps
                 if {r for s2, r, _ in spans if s2 == s} >= set(ranks))
    return job[(len(job) - 1) // 2][1]


@pytest.fixture(scope="module")
def recorded(recorded_store, tmp_path_factory):
    """The recorded run exported with the defaults: (store con, run_id, export path, result, trace)."""
    path = tmp_path_factory.mktemp("perfetto") / "recorded.json"
    con = open_store(recorded_store["db"], read_only=True)
    result = export_perfetto(con, recorded_store["run_id"], path)
    yield con, recorded_store["run_id"], path, result, load(path)
    con.close()


def test_recorded_export_is_one_step_of_every_rank(recorded):
    con, run_id, path, result, trace = recorded
    assert result["ranks"] == [0, 1, 2, 3] and result["step"] == median_step(con, run_id, [0, 1, 2, 3])
    assert result["bytes"] == path.stat().st_size and result["unaligned_ranks"] == []
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    hosts = dict(con.execute("SELECT rank, host FROM ranks WHERE run_id = ?", [run_id]).fetchall())
    assert names == {r: f"rank {r} · {hosts[r]}" for r in range(4)}
    assert {e["pid"] for e in events} == {0, 1, 2, 3}
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert steps == {f"ProfilerStep#{result['step']}"}
    data = [e for e in events if e["ph"] != "M" and e.get("cat") != "bprof.match"]
    assert len(data) == result["events"] and all(e["ts"] >= 0 for e in data)
    # every event the store put in the step is there, on its rank
    in_step = con.execute("SELECT count(*) FROM events WHERE run_id = ? AND step = ?", [run_id, result["step"]]).fetchone()[0]
    assert in_step <= len(data)
    # threads: each tid belongs to one rank and is named; the main thread says so
    tids = {(e["pid"], e["tid"]) for e in data}
    named = {(e["pid"], e["tid"]) for e in events if e.get("name") == "thread_name"}
    assert tids <= named and len({t for _, t in tids}) == len(tids)
    assert sum(1 for e in events if e.get("name") == "thread_name" and e["args"]["name"].endswith("· main")) == 4
    header = trace["bprofExport"]
    assert header["version"] == 1 and header["step"] == result["step"] and [r["rank"] for r in header["ranks"]] == [0, 1, 2, 3]


def test_recorded_export_times_are_the_analyzers_aligned_times(recorded):
    """Each member's device work (the gloo range) starts at match_members_aligned.arrival_aligned_ns and
    ends at end_aligned_ns, to the nanosecond."""
    con, run_id, _, result, trace = recorded
    base = trace["bprofExport"]["base_time_ns"]
    gloo = {(e["pid"], base + round(e["ts"] * 1000)): base + round((e["ts"] + e["dur"]) * 1000)
            for e in trace["traceEvents"] if e["ph"] == "X" and e["name"].startswith("gloo:")}
    members = con.execute("""SELECT rank, arrival_aligned_ns, end_aligned_ns FROM match_members_aligned
                             WHERE run_id = ? AND step = ?""", [run_id, result["step"]]).fetchall()
    assert members and all(gloo[(rank, start)] == end for rank, start, end in members)


def test_recorded_export_links_every_matched_instance(recorded):
    con, run_id, _, result, trace = recorded
    expected = instances(con, run_id, result["step"])
    by_id = flows(trace)
    assert len(by_id) == result["flows"] == len(expected) > 0
    for chain in by_id.values():
        assert [e["ph"] for e in chain] == ["s", *["t"] * (len(chain) - 2), "f"] and chain[-1]["bp"] == "e"
        assert len({e["pid"] for e in chain}) == len(chain) and len({e["name"] for e in chain}) == 1
    assert sorted(sorted(e["pid"] for e in chain) for chain in by_id.values()) == sorted(m for *_, m in expected)


def test_recorded_export_reingests_with_the_same_collectives_matched(recorded, tmp_path):
    con, run_id, path, result, _ = recorded
    again, again_id = reingest(path, tmp_path)
    want = instances(con, run_id, result["step"])
    assert instances(again, again_id) == want and {i[5] for i in want} == {"complete"}
    # the events and collectives of the step are the original's, on the aligned clock (one host: offset 0)
    events = """SELECT rank, kind, cat, name, pid, tid, device, stream, ts_ns, dur_ns, correlation, external_id, step,
                       CAST(args AS VARCHAR) FROM events WHERE run_id = ? AND step = ? ORDER BY ALL"""
    assert again.execute(events, [again_id, result["step"]]).fetchall() == con.execute(events, [run_id, result["step"]]).fetchall()
    calls = """SELECT rank, op, pg_name, pg_desc, pg_ranks, seq, peer_rank, dtype, in_bytes, tid, cpu_ts_ns, cpu_dur_ns,
                      device_ts_ns, device_dur_ns FROM collectives WHERE run_id = ? AND step = ? ORDER BY ALL"""
    assert again.execute(calls, [again_id, result["step"]]).fetchall() == con.execute(calls, [run_id, result["step"]]).fetchall()
    assert again.execute("SELECT world_size, missing_ranks, consistent FROM runs").fetchone() == (4, [], True)


def test_chosen_ranks_and_step(recorded, tmp_path):
    con, run_id, _, _, _ = recorded
    steps = [s for (s,) in con.execute("SELECT DISTINCT step FROM timeline_spans WHERE run_id = ? ORDER BY step",
                                       [run_id]).fetchall()]
    path = tmp_path / "two.json.gz"
    result = export_perfetto(con, run_id, path, step=steps[-1], ranks=[2, 0])
    trace = load(path)
    assert (result["step"], result["ranks"]) == (steps[-1], [0, 2])
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 2}
    both = [m for *_, m in instances(con, run_id, steps[-1]) if {0, 2} <= set(m)]
    assert sorted(sorted(e["pid"] for e in chain) for chain in flows(trace).values()) == [[0, 2]] * len(both)


def test_usage_errors(recorded, report_store, tmp_path):
    con, run_id, _, _, _ = recorded
    out = tmp_path / "x.json"
    with pytest.raises(UsageError, match="rank 9 is not in run"):
        export_perfetto(con, run_id, out, ranks=[0, 9])
    with pytest.raises(UsageError, match="65 ranks chosen; a Perfetto export holds at most 64"):
        export_perfetto(con, run_id, out, ranks=list(range(65)))
    with pytest.raises(UsageError, match=r"step 99 was not captured on rank 0 \(its steps: "):
        export_perfetto(con, run_id, out, step=99)
    assert not out.exists() and not list(tmp_path.iterdir())
    fleet = open_store(report_store["db"], read_only=True)
    try:
        with pytest.raises(UsageError, match="has 1024 ranks; choose at most 64 with --ranks"):
            export_perfetto(fleet, report_store["fleet"], out)
    finally:
        fleet.close()
    # the CLI: exit 2 and one line, for the flags too
    db = con.execute("SELECT path FROM duckdb_databases() WHERE NOT internal").fetchone()[0]
    for args, message in [(["--ranks", "0,9"], "rank 9 is not in run"), (["--ranks", "0-64"], "65 ranks chosen"),
                          (["--step", "99"], "step 99 was not captured on rank 0"), (["--ranks", "a-b"], "--ranks 'a-b'"),
                          (["--ranks", "3-1"], "is empty"), (["--step", "1", "--parquet", str(tmp_path)], "one of them")]:
        done = cli("export", run_id, "--db", db, "--perfetto", out, *args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, (args, done.stderr)


def test_cli_json(recorded, tmp_path):
    con, run_id, _, result, _ = recorded
    db = con.execute("SELECT path FROM duckdb_databases() WHERE NOT internal").fetchone()[0]
    done = cli("export", run_id, "--db", db, "--perfetto", tmp_path / "t.json", "--ranks", "0-1,3", "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["ranks"] == [0, 1, 3] and printed["step"] == median_step(con, run_id, [0, 1, 3])
    assert printed["bytes"] == (tmp_path / "t.json").stat().st_size


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A synthetic 8-GPU NCCL run (tp2 pp2 dp2) on four hosts of two ranks, whose clocks put each DP
    pair 350 us apart, analysed and exported with the defaults."""
    from bprof.synth import Scenario

    from tests.analyzers import recorded

    out = tmp_path_factory.mktemp("perfetto-synth")
    scenario = Scenario(tp=2, pp=2, dp=2, steps=3, hosts=4,
                        clock_offset_ns={0: 0, 1: 350_000, 2: -200_000, 3: 150_000},
                        clock_jitter_ns=5_000, seed=3)
    con, run_id, _ = recorded.synthetic(out, scenario, analysis.ANALYZERS)
    path = out / "synthetic.json"
    result = export_perfetto(con, run_id, path)
    yield con, run_id, path, result, load(path)
    con.close()


def test_synthetic_nccl_streams_and_alignment(synthetic):
    con, run_id, _, result, trace = synthetic
    assert result["ranks"] == list(range(8)) and result["unaligned_ranks"] == []
    events = trace["traceEvents"]
    streams = {e["args"]["name"] for e in events if e.get("name") == "thread_name" and e["args"]["name"].startswith("GPU ")}
    assert {"GPU 0 · stream 7", "GPU 0 · stream 20", "GPU 0 · stream 24"} <= streams
    # aligned, the members of every all-reduce spanning two hosts end together, as the synthetic
    # model has them (within its jitter); on their own clocks they are 350 us apart
    base = trace["bprofExport"]["base_time_ns"]
    offsets = dict(con.execute("SELECT rank, clock_offset_ns FROM ranks WHERE run_id = ?", [run_id]).fetchall())
    kernels = {(e["pid"], base + round(e["ts"] * 1000)): base + round((e["ts"] + e["dur"]) * 1000)
               for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")}
    spans = con.execute("""
        SELECT i.instance_id, list(m.rank), list(m.arrival_aligned_ns), list(m.end_ts_ns), list(m.end_aligned_ns)
        FROM match_instances i JOIN match_members_aligned m USING (run_id, instance_id) JOIN ranks k USING (run_id, rank)
        WHERE run_id = ? AND i.step = ? AND i.op = 'all_reduce' AND i.status = 'complete'
        GROUP BY ALL HAVING count(DISTINCT k.host) = 2""", [run_id, result["step"]]).fetchall()
    assert spans and len(set(offsets.values())) == 4
    for _, ranks, arrivals, own_ends, ends in spans:
        exported = [kernels[(r, a)] for r, a in zip(ranks, arrivals)]
        assert exported == ends  # the analyzers' aligned times, to the nanosecond
        assert max(exported) - min(exported) < 50_000 < 300_000 < max(own_ends) - min(own_ends)


def test_hostile_kernel_names_stay_text(report_store, tmp_path):
    con = open_store(report_store["db"], read_only=True)
    try:
        export_perfetto(con, report_store["synthetic"], tmp_path / "hostile.json", ranks=[0])
    finally:
        con.close()
    trace = load(tmp_path / "hostile.json")
    assert any(e["name"] == report_store["hostile"] for e in trace["traceEvents"] if e.get("cat") == "kernel")


def test_synthetic_reingests_with_the_same_matches_and_p2p_arrows(synthetic, tmp_path):
    con, run_id, path, result, trace = synthetic
    want = instances(con, run_id, result["step"])
    p2p = [i for i in want if i[0] == "p2p"]
    assert p2p and len(flows(trace)) == len(want)
    for chain in flows(trace).values():
        if chain[0]["name"].startswith("p2p"):
            inst = next(i for i in p2p if sorted(e["pid"] for e in chain) == i[6] and f"#{i[2]}" in chain[0]["name"])
            assert [e["pid"] for e in chain] == [inst[3], inst[4]]  # send -> recv
    again, again_id = reingest(path, tmp_path)
    assert instances(again, again_id) == want
    # re-ingested times are the aligned ones: the new run's clocks agree within the old residuals
    assert again.execute("SELECT max(abs(clock_offset_ns)) FROM ranks WHERE run_id = ?", [again_id]).fetchone()[0] < 50_000


def test_untrusted_names_round_trip(tmp_path):
    traces = [modern_trace(r) for r in range(2)]
    for e in traces[0]["traceEvents"]:
        if e["name"] == "aten::mm":
            e["name"] = EVIL
            e["args"]["Concrete Inputs"] = [EVIL]
    for r, t in enumerate(traces):
        write(tmp_path / "job" / f"rank{r}.json", t)
    con = open_store(tmp_path / "s.duckdb")
    [run] = ingest_paths(con, [tmp_path / "job"], IngestOptions(work_dir=tmp_path))
    analysis.analyze_run(con, run.run_id, Options())
    path = tmp_path / "evil.json"
    export_perfetto(con, run.run_id, path, step=2)
    text = path.read_text(encoding="utf-8")
    assert "<script>" in text  # JSON carries the text as is; escaping is the viewer's job
    [evil] = [e for e in json.loads(text)["traceEvents"] if e.get("name") == EVIL]
    assert evil["args"]["Concrete Inputs"] == [EVIL]
    again, again_id = reingest(path, tmp_path)
    assert again.execute("SELECT args ->> '$.\"Concrete Inputs\"[0]' FROM events WHERE run_id = ? AND name = ?",
                         [again_id, EVIL]).fetchall() == [(EVIL,)]
    con.close()


def test_an_unanalysed_run_is_refused(tmp_path):
    for r in range(2):
        write(tmp_path / "job" / f"rank{r}.json", modern_trace(r))
    con = open_store(tmp_path / "s.duckdb")
    ingest_paths(con, [tmp_path / "job"], IngestOptions(work_dir=tmp_path))
    with pytest.raises(UsageError, match=r"run 1 has not been analysed: run `bprof analyze 1` first"):
        export_perfetto(con, 1, tmp_path / "x.json")
    con.close()


def test_a_malformed_export_is_bad_data_and_leaves_the_store_as_it_was(recorded, tmp_path):
    _, _, path, _, trace = recorded
    db = tmp_path / "s.duckdb"
    for name, change, message in [
        ("version", lambda t: t["bprofExport"].update(version=99), "bprofExport version 99"),
        ("thread", lambda t: t["bprofExport"]["ranks"][0].update(threads=[]), "a thread bprofExport does not list"),
        ("call", lambda t: next(e for e in t["traceEvents"] if "bprof.collective" in e.get("args", {}))
         ["args"]["bprof.collective"].update(seq="x"), "malformed seq"),
    ]:
        bad = json.loads(json.dumps(trace))
        change(bad)
        target = tmp_path / f"{name}.json"
        target.write_text(json.dumps(bad))
        done = cli("ingest", target, "--db", db)
        assert done.returncode == 3 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert duckdb.connect(str(db), read_only=True).execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_the_exporter_needs_neither_torch_nor_dash():
    code = ("import sys, bprof.dashboards.perfetto, bprof.cli.export; "
            "print(sorted(m for m in ('torch', 'dash', 'plotly') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
