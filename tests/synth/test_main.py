"""`python -m bprof.synth` writes the run the demo ingests."""

from __future__ import annotations

import json

from bprof.synth.__main__ import main


def test_cli_writes_ranks_truth_and_planted_fault(tmp_path, capsys):
    main([str(tmp_path / "run"), "--tp", "2", "--dp", "2", "--steps", "1", "--slow-rank", "1", "--slow-ms", "2"])
    truth = json.loads((tmp_path / "run" / "truth.json").read_text())
    assert sorted(p.name for p in (tmp_path / "run").glob("rank*.json.gz")) == [f"rank{r}.json.gz" for r in range(4)]
    assert [(f["kind"], f["rank"], f["extra_ns"]) for f in truth["faults"]] == [("slow_rank", 1, 2_000_000)]
    assert "wrote 4 rank traces" in capsys.readouterr().out
