"""`bprof record --watch` end to end on a real 4-rank DDP job (gloo, CPU): a rank that turns slow
at iteration 40, from outside bprof, is named live, a trace window opens by itself while it is
slow and `bprof analyze` on that window names the rank; the same job without the fault opens no
window; the metrics endpoint is scraped while the job runs."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import run_group, upstream_exit_abort

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "ddp_mlp.py"
STEPS = 110
SLOW_FROM, SLOW_MS, SLOW_RANK = 40, 30, 2


def command(out: Path, name: str, *program_args: str, metrics: bool = False) -> list[str]:
    return [sys.executable, "-m", "bprof.cli.main", "record", "--watch", "--out", str(out / name),
            "--db", str(out / f"{name}.duckdb"), "--name", name, "--steps", "100000:100003",
            *(["--metrics-port", "0", "--metrics-addr", "127.0.0.1"] if metrics else []), "--",
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", str(PROGRAM),
            "--steps", str(STEPS), *program_args]


def scrape_while_running(cmd: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run cmd; once it says where its metrics are, scrape them until every rank has reported 30
    iterations (the job goes on meanwhile); the scrapes' texts, newest last."""
    scrapes: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                          start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"}) as proc:
        err_lines: list[str] = []
        url = []

        def read_stderr():
            for line in proc.stderr:
                err_lines.append(line)
                found = re.search(r"metrics at (http://\S+/metrics)", line)
                if found:
                    url.append(found.group(1))

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.3)
            if not url:
                continue
            try:
                text = urllib.request.urlopen(url[0], timeout=5).read().decode()
            except OSError:
                continue
            scrapes.append(text)
            if re.search(r"^bprof_watch_iteration\{[^}]*\} (\d+)", text, re.M) and \
                    int(re.search(r"^bprof_watch_iteration\{[^}]*\} (\d+)", text, re.M).group(1)) >= 30:
                break
        try:
            out = proc.stdout.read() if proc.wait(timeout=300) is not None else ""
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        reader.join(timeout=10)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "".join(err_lines)), scrapes


class Jobs(NamedTuple):
    out: Path
    clean_name: str
    clean: subprocess.CompletedProcess
    slow_name: str
    slow: subprocess.CompletedProcess
    scrapes: list[str]  # the metrics endpoint's answers while the slow job ran


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The clean job, then the slowed one (scraped while it runs), recorded one after the other."""
    out = tmp_path_factory.mktemp("watch")
    for attempt in range(2):
        clean = run_group(command(out, f"clean{attempt}"), timeout=300, cwd=out,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
        if not upstream_exit_abort(clean):
            break
    assert clean.returncode == 0, clean.stderr[-3000:]
    for attempt_slow in range(2):
        slow, scrapes = scrape_while_running(command(out, f"slow{attempt_slow}", "--slow-rank", str(SLOW_RANK),
                                                     "--slow-ms", str(SLOW_MS), "--slow-from", str(SLOW_FROM),
                                                     metrics=True), out)
        if not upstream_exit_abort(slow):
            break
    assert slow.returncode == 0, slow.stderr[-3000:]
    return Jobs(out, f"clean{attempt}", clean, f"slow{attempt_slow}", slow, scrapes)


def live(out: Path, name: str) -> dict:
    return json.loads((out / name / "watch" / "live.json").read_text())


def step_rows(out: Path, name: str) -> dict[int, dict[int, dict]]:
    """rank -> iteration -> row of the run's watch files."""
    from bprof.watch import files

    found: dict[int, dict[int, dict]] = {}
    for folder in files.rank_folders(out / name):
        for path in files.step_files(folder.path):
            columns, _ = files.read_steps(path)
            for values in zip(*columns.values()):
                row = dict(zip(columns, values))
                found.setdefault(folder.rank, {})[row["iteration"]] = row
    return found


def test_every_rank_reports_every_iteration_and_the_clean_job_opens_no_window(jobs):
    out, clean_name, clean = jobs.out, jobs.clean_name, jobs.clean
    rows = step_rows(out, clean_name)
    # iterations 1..STEPS-1: the first optimizer step starts bprof's count, the last one ends the last row
    assert sorted(rows) == [0, 1, 2, 3] and all(sorted(r) == list(range(1, STEPS)) for r in rows.values())
    data = live(out, clean_name)
    assert data["newest_complete_iteration"] == STEPS - 1
    assert data["triggers"] == [] and not list((out / clean_name / "traces").glob("iteration_*/rank*.json.gz"))
    # busy time is the training thread's CPU time: never more than the wall time of its step
    assert all(row["busy_ns"] <= row["step_ns"] * 1.05 for r in rows.values() for row in r.values())
    assert "0 window(s) opened by the watch" in clean.stderr


def test_the_slow_rank_is_named_live_and_a_window_opens_while_it_is_slow(jobs):
    out, slow_name, slow = jobs.out, jobs.slow_name, jobs.slow
    data = live(out, slow_name)
    named = [e for e in data["episodes"] if e["rule"] == "rank"]
    assert [e["rank"] for e in named] == [SLOW_RANK], data["episodes"]
    # within a few iterations of turning slow (the rule needs 5 running)
    assert SLOW_FROM <= named[0]["first_iteration"] <= SLOW_FROM + 5
    assert re.search(rf"bprof watch: iteration \d+: rank {SLOW_RANK} on \S+ spends", slow.stderr)
    [trigger] = data["triggers"]
    assert trigger["seen_at"] <= SLOW_FROM + 10 and SLOW_FROM < trigger["start"] < STEPS - trigger["steps"]
    window = out / slow_name / "traces" / f"iteration_{trigger['start']}"
    assert sorted(p.name for p in window.glob("rank*.json.gz")) == [f"rank{r}.json.gz" for r in range(4)]
    for rank in range(4):  # every rank keeps why its window opened
        meta = json.loads((out / slow_name / "meta" / f"rank{rank}.json").read_text())
        [captured] = meta["windows_captured"]
        assert captured["window"] == f"{trigger['start']}:{trigger['start'] + 3}"
        assert captured["trigger"] == trigger["reason"]
    # the window's iterations are marked in the watch rows, so no baseline takes the profiler's cost
    rows = step_rows(out, slow_name)
    assert {i for i, row in rows[0].items() if row["windowed"]} == set(range(trigger["start"], trigger["start"] + 3))


def test_analyze_on_the_triggered_window_names_the_slow_rank_with_its_cost(jobs):
    out, clean_name, slow_name = jobs.out, jobs.clean_name, jobs.slow_name
    done = subprocess.run([sys.executable, "-m", "bprof.cli.main", "analyze", "--db", str(out / f"{slow_name}.duckdb"),
                           "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    analysis = json.loads(done.stdout)
    # the rank is named, priced or (withheld, under load: CI once) with its extra own time
    stragglers = [f for f in analysis["findings"] if f["analyzer"] == "stragglers" and f["evidence"].get("ranks")]
    assert stragglers and stragglers[0]["evidence"]["ranks"] == [SLOW_RANK], analysis["findings"]
    assert stragglers[0]["lost_ns"] or stragglers[0]["evidence"].get("extra_own_ns"), stragglers[0]
    # the truth: the slowed job's unprofiled steps after the fault began against the clean job's
    slowed, clean = step_rows(out, slow_name), step_rows(out, clean_name)
    after = range(SLOW_FROM + 5, STEPS)
    truth_ns = statistics.median(max(r[i]["step_ns"] for r in slowed.values()) for i in after
                                 if not slowed[0][i]["windowed"]) - \
        statistics.median(max(r[i]["step_ns"] for r in clean.values()) for i in after)
    cost_ns, extra_ns = stragglers[0]["lost_ns"], stragglers[0]["evidence"].get("extra_own_ns")
    print(f"\nstraggler: {stragglers[0]['title']}; measured truth {truth_ns / 1e6:.1f} ms")
    assert truth_ns > 0.5 * SLOW_MS * 1e6  # the fault is real: it lengthened the job's step
    # a small straggler's finding says the rank's extra own time: the truth within the battery's
    # load-tolerant margin (issue 20); a flagged one is priced by its lost_ns
    if extra_ns is not None:
        assert abs(extra_ns - truth_ns) <= 0.5 * truth_ns
    # its price is the what-if engine's: on 4 ranks sharing 2 cores it kept the slowed rank's own
    # transfers (starved by its fault) and priced 2.5 ms against 27.3 measured (docs/whatif.md); held
    # to the invariants only
    assert cost_ns is None or 0 < cost_ns <= analysis["metrics"]["step_time_ns"]["value"]


def test_the_metrics_endpoint_serves_every_rank_while_the_job_runs(jobs):
    from prometheus_client.parser import text_string_to_metric_families

    slow_name, scrapes = jobs.slow_name, jobs.scrapes
    assert scrapes, "no scrape answered"
    families = {f.name: f for f in text_string_to_metric_families(scrapes[-1])}
    assert {"bprof_watch_iteration", "bprof_rank_step_seconds", "bprof_straggler_score", "bprof_host_straggler_score",
            "bprof_windows_triggered", "bprof_data_wait_seconds", "bprof_gc_seconds"} <= set(families)
    iteration = families["bprof_watch_iteration"].samples[0].value
    assert 30 <= iteration < STEPS  # scraped while the job ran, not after
    scores = {s.labels["rank"]: s.value for s in families["bprof_straggler_score"].samples}
    assert sorted(scores) == ["0", "1", "2", "3"] and all(v > 0 for v in scores.values())
    quantiles = {(s.labels["rank"], s.labels["quantile"]) for s in families["bprof_rank_step_seconds"].samples}
    assert quantiles == {(str(r), q) for r in range(4) for q in ("0.5", "0.9", "0.99")}
    assert all(s.labels["run"] == slow_name for f in families.values() for s in f.samples)
