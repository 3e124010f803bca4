"""Plain `python train.py` under `bprof record`: no launcher variables at all, so the one training
process claims rank 0 of a world of 1 at its first optimizer step, inside torch's optimizer hooks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.launchers.recording import assert_every_rank_recorded, rank_metas, record

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("hooked_train.py")


def test_hang_timeout_heartbeat_starts_once_the_rank_is_decided(tmp_path):
    """--hang-timeout's heartbeat registers an optimizer hook of its own, which torch forbids while
    it runs its hooks: that is when a process without RANK learns it is rank 0. The script has a
    global post-hook of its own after bprof's, so torch would notice (OrderedDict mutated)."""
    done = record(tmp_path, [sys.executable, str(SCRIPT)], options=["--hang-timeout", "120"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hooked_train: done, the script's hook ran 6 times" in done.stdout
    assert_every_rank_recorded(tmp_path, 1)[0].close()
    assert rank_metas(tmp_path)[0]["notes"] == ["rank 0 of 1 from single process (no RANK at import torch)"]
    beat = json.loads((tmp_path / "run" / "hang" / "heartbeat" / "rank0.json").read_text())
    ended = json.loads((tmp_path / "run" / "hang" / "rank0.exit").read_text())
    assert beat["rank"] == 0 and beat["world_size"] == 1
    assert 1 <= ended["step"] <= 6  # counted from the step after the first (the heartbeat starts there)
