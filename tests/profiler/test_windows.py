"""Step windows and iteration counting, without launching anything."""

from __future__ import annotations

import pytest

from bprof.errors import UsageError
from bprof.profiler.windows import Window, parse_windows, triggered_window


def test_parse_windows():
    assert parse_windows("10:15,5000:5005") == (Window(10, 15), Window(5000, 5005))
    assert parse_windows(" 7:9 , 2:4") == (Window(2, 4), Window(7, 9))
    for bad, why in (("3", "START:END"), ("5:5", "empty"), ("4:2", "empty"), ("2:6,5:8", "overlap"), ("", "no window"),
                     ("a:b", "START:END")):
        with pytest.raises(UsageError, match=why):
            parse_windows(bad)


def test_on_demand_windows_start_at_the_next_multiple_of_8():
    assert triggered_window(0, 3) == Window(8, 11)
    assert triggered_window(7, 3) == Window(8, 11)
    assert triggered_window(8, 5) == Window(16, 21)


def test_several_optimizers_in_one_iteration_count_once(tmp_path, monkeypatch):
    monkeypatch.setenv("BPROF_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("BPROF_STEPS", "2:4")
    from bprof.profiler.rank_hook import Recorder

    rec = Recorder(tmp_path)
    seen = []
    monkeypatch.setattr(rec, "boundary", lambda k: (seen.append(k), setattr(rec, "iteration", k)))
    dense, sparse = object(), object()
    for _ in range(3):  # three iterations, each stepping two optimizers
        rec._on_optimizer_step(dense, (), {})
        rec._on_optimizer_step(sparse, (), {})
    assert seen == [1, 2, 3]


def test_a_window_bprof_reaches_late_starts_late(tmp_path, monkeypatch):
    monkeypatch.setenv("BPROF_STEPS", "0:3,5:6")
    from bprof.profiler.rank_hook import Recorder

    rec = Recorder(tmp_path)
    started = []
    monkeypatch.setattr(rec, "_start", lambda w: started.append(w))
    for k in range(1, 7):
        rec.boundary(k)
    assert started == [Window(1, 3), Window(5, 6)]
    assert rec.notes == ["window 0:3 started late, at iteration 1"]
