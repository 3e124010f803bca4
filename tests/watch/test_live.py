"""The live analysis of `bprof record --watch` on rows whose answers are derived by hand, read
from real watch files written by the ranks' own writer (WatchLog, without torch's hooks)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from bprof.profiler.watch_rank import ROW_COLUMNS, WatchLog
from bprof.watch import files
from bprof.watch.live import LiveWatch, WatchOptions

MS = 1_000_000


def rows(first: int, last: int, busy_ns, step_ns=20 * MS, windowed=()) -> dict:
    """Columns of a steps file for iterations first..last of one rank; busy_ns(iteration) -> ns."""
    its = list(range(first, last + 1))
    steps = [step_ns(i) if callable(step_ns) else step_ns for i in its]
    ends = [sum(steps[:k + 1]) for k in range(len(its))]
    return {"iteration": its, "start_ns": [e - s for e, s in zip(ends, steps)], "end_ns": ends, "step_ns": steps,
            "busy_ns": [busy_ns(i) for i in its], "data_wait_ns": [0] * len(its), "data_idle_ns": [0] * len(its),
            "gc_ns": [0] * len(its), "blocked_ns": [0] * len(its), "windowed": [i in windowed for i in its]}


def test_a_rank_that_computes_three_times_its_peers_is_named_and_a_window_is_asked_for(tmp_path):
    live = LiveWatch(tmp_path, WatchOptions(flush_every=10, poll_s=0.2))
    slow_from = 30
    for rank in range(4):
        live.add_rows(rank, rows(1, 40, lambda i, r=rank: 15 * MS if (r == 2 and i >= slow_from) else 5 * MS),
                      "h0" if rank < 2 else "h1")
    said = live.score()
    score = live.state.ranks[2]
    # rank 2: 15 ms against its peers' median 5 ms: 3x, +10 ms; the others 5 against the median of
    # (5, 5, 15) = 5: 1x
    assert score.score == pytest.approx(3.0) and score.excess_ns == 10 * MS
    assert [live.state.ranks[r].score for r in (0, 1, 3)] == [1.0, 1.0, 1.0]
    [episode] = live.state.episodes
    # the rank rule needs 5 iterations running above 1.3x (and 10 % of the step): iterations 30-34
    assert (episode.rule, episode.rank, episode.first_iteration, episode.triggered) == ("rank", 2, 30, True)
    [trigger] = live.state.triggers
    assert trigger.seen_at == 34
    # beyond what a rank may have run before it reads the trigger: the newest row (40) + the rows a
    # rank keeps before a flush (10) + a poll interval's iterations (0.2 s / 20 ms = 10) + 2
    assert trigger.start == 40 + 10 + 10 + 2
    asked = json.loads((tmp_path / "trigger").read_text())
    assert asked == {"start": 62, "steps": 3, "reason": trigger.reason}
    assert "rank 2 on h1" in trigger.reason and "3.00x" in trigger.reason
    assert any("opening a trace window 62:65" in line for line in said)
    # the step did not change, so the step rule stays quiet
    assert live.state.episodes[0].rule == "rank" and len(live.state.episodes) == 1


def test_the_step_rule_fires_on_a_doubled_step_and_its_median_does_not_learn_the_slow_steps(tmp_path):
    live = LiveWatch(tmp_path, WatchOptions())
    step = lambda i: 60 * MS if 30 <= i < 70 else 20 * MS  # noqa: E731
    for rank in range(3):
        live.add_rows(rank, rows(1, 90, lambda i: 5 * MS, step_ns=step))
    live.score()
    [episode] = live.state.episodes
    # 3x the rolling median (20 ms) for 5 iterations running: fired at iteration 34, and it lasted to
    # 69: the median kept 20 ms (a median that learnt the slow steps would have called it normal
    # after 25 iterations of 60 ms)
    assert (episode.rule, episode.first_iteration, episode.last_iteration) == ("step", 30, 69)
    assert live.state.triggers[0].seen_at == 34 and "3.00x the rolling median 20.0 ms" in live.state.triggers[0].reason


def test_windowed_and_warm_up_iterations_are_left_out_and_one_episode_opens_one_window(tmp_path):
    opts = WatchOptions(warmup=10)
    live = LiveWatch(tmp_path, opts)
    # every iteration has rank 1 at 4x, but the first 10 are warm-up and 10-19 are a trace window
    for rank in range(3):
        live.add_rows(rank, rows(1, 60, lambda i, r=rank: 20 * MS if r == 1 else 5 * MS,
                                 windowed=range(10, 20)))
    live.score()
    [episode] = live.state.episodes
    assert episode.first_iteration == 20  # the first scored iteration, after warm-up and the window
    assert len(live.state.triggers) == 1  # the rank stayed slow: still one episode, one window


def test_at_most_the_hourly_cap_of_windows(tmp_path):
    live = LiveWatch(tmp_path, WatchOptions(max_windows_per_hour=1, window=3))
    # rank 0 slow in two separate spells, each long enough to open an episode
    slow = lambda i: 20 * MS if (15 <= i < 25 or 50 <= i < 60) else 5 * MS  # noqa: E731
    for rank in range(3):
        live.add_rows(rank, rows(1, 80, slow if rank == 0 else (lambda i: 5 * MS)))
    live.score()
    assert [(e.first_iteration, e.triggered) for e in live.state.episodes] == [(15, True), (50, False)]
    assert len(live.state.triggers) == 1


def test_files_written_by_the_rank_writer_are_read_back_and_a_restart_replaces_the_old_attempt(tmp_path):
    # the rank side's own writer: rows flushed every 4 iterations, under temporary names then renamed
    logs = [WatchLog(tmp_path, rank, "host-a", flush_every=4, flush_s=3600) for rank in range(2)]
    for it in range(1, 10):
        for log in logs:
            log.boundary(it, windowed=False)
    for log in logs:
        log.flush()
    names = sorted(p.name for p in (tmp_path / "watch" / "rank0").iterdir())
    # rows of iterations 1-8 (the boundary at 9 completes 8), in files starting at 1 and 5; 9 was
    # never completed (no boundary after it)
    assert names == ["000000001.steps.parquet", "000000005.steps.parquet"]
    table = pq.read_table(tmp_path / "watch" / "rank0" / names[0])
    assert table.column_names == list(ROW_COLUMNS) and table.column("iteration").to_pylist() == [1, 2, 3, 4]
    assert json.loads(table.schema.metadata[b"bprof_watch"]) == {"rank": 0, "host": "host-a", "attempt": 0,
                                                                "model_flops_per_step": None, "device_properties": None}
    live = LiveWatch(tmp_path, WatchOptions(warmup=0))
    live.poll()
    assert live.state.newest_complete == 8 and sorted(live.rows) == [0, 1]
    # a restarted attempt of rank 1 starts again from iteration 1: its rows replace the old attempt's
    restarted = WatchLog(tmp_path, 1, "host-a", attempt=1, flush_every=2, flush_s=3600)
    for it in range(1, 4):
        restarted.boundary(it, windowed=False)
    assert [f.name for f in (tmp_path / "watch").iterdir()] and \
        [(f.rank, f.attempt) for f in files.rank_folders(tmp_path)] == [(0, 0), (1, 0), (1, 1)]
    live.poll()
    assert sorted(live.rows[1]) == [1, 2] and live.attempt == {1: 1}


def test_live_json_keeps_triggers_episodes_and_scores(tmp_path):
    live = LiveWatch(tmp_path, WatchOptions(trigger=False))
    for rank in range(3):
        live.add_rows(rank, rows(1, 30, lambda i, r=rank: 10 * MS if r == 0 else 5 * MS))
    live.score()
    live.save()
    data = files.read_live(tmp_path)
    assert data["triggers"] == []  # --no-watch-trigger: scored and said, no window
    assert [(e["rule"], e["rank"], e["triggered"]) for e in data["episodes"]] == [("rank", 0, False)]
    assert [s["rank"] for s in data["scores"]] == [0, 1, 2] and data["scores"][0]["score"] == 2.0
    assert not (tmp_path / "trigger").exists()


def test_mfu_is_served_where_flops_are_declared_and_every_rank_is_a_known_device(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from bprof.watch import metrics

    live = LiveWatch(tmp_path, WatchOptions())
    a100 = {"name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0, "numSms": 108,
            "totalGlobalMem": 85_095_874_560}
    for rank in range(2):
        live.add_rows(rank, rows(1, 20, lambda i: 5 * MS, step_ns=100 * MS), "h0")
        live.meta[rank] = {"model_flops_per_step": 2.0e13, "device_properties": a100}
    live.score()
    families = {f.name: f for f in text_string_to_metric_families(metrics.text(live.snapshot()))}
    # 2e13 FLOPs a step in 0.1 s = 2e14 FLOP/s, over two A100s' dense bf16 peak (312 TFLOP/s each)
    assert families["bprof_model_flops_per_second"].samples[0].value == pytest.approx(2.0e14)
    assert families["bprof_mfu"].samples[0].value == pytest.approx(2.0e14 / 624e12)
    live.meta[1] = {"model_flops_per_step": 2.0e13}  # a rank whose device is not known: no MFU
    assert "bprof_mfu" not in {f.name for f in text_string_to_metric_families(metrics.text(live.snapshot()))}


def test_model_flops_given_to_bprof_record_win_over_the_ranks_and_are_kept_in_live_json(tmp_path):
    from bprof.watch.runner import WatchThread

    watch = WatchThread(tmp_path, WatchOptions(), model_flops_per_step=4.0e13)
    live = watch.live
    for rank in range(2):
        live.add_rows(rank, rows(1, 20, lambda i: 5 * MS, step_ns=100 * MS), "h0")
        live.meta[rank] = {"model_flops_per_step": 2.0e13}
    live.score()
    assert live.snapshot().model_flops_per_step == 4.0e13
    live.save()
    assert files.read_live(tmp_path)["options"]["model_flops_per_step"] == 4.0e13


def test_hosts_take_the_highest_score_of_their_ranks(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from bprof.watch import metrics

    live = LiveWatch(tmp_path, WatchOptions(trigger=False))
    busy = {0: 5, 1: 6, 2: 5, 3: 10}  # ms: rank 3 on h1 is the slow one
    for rank, ms in busy.items():
        live.add_rows(rank, rows(1, 20, lambda i, ms=ms: ms * MS), "h0" if rank < 2 else "h1")
    live.score()
    families = {f.name: f for f in text_string_to_metric_families(metrics.text(live.snapshot()))}
    hosts = {s.labels["host"]: s.value for s in families["bprof_host_straggler_score"].samples}
    # rank 3: 10 ms over the median of (5, 6, 5) = 5: 2.0; rank 1: 6 over median (5, 5, 10) = 5: 1.2
    assert hosts == {"h0": pytest.approx(1.2), "h1": pytest.approx(2.0)}
