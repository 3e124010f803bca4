"""Analysis, store, CLI and CI gating work on a machine without torch (a CI runner that only
checks): prove it with torch blocked."""

from __future__ import annotations

import subprocess
import sys

# Python run with this first imports no torch (other tests prepend it to their own scripts).
TORCH_BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == 'torch' or name.startswith('torch.'):
            raise ImportError('torch is blocked in this test')
sys.meta_path.insert(0, Block())
"""
BLOCK_TORCH = TORCH_BLOCKER + """import bprof, bprof.store.ingest, bprof.store.runs, bprof.analyzers, bprof.dashboards, bprof.kernels, bprof.cli.main
import bprof.ci.check, bprof.ci.causes, bprof.ci.history, bprof.ci.report, bprof.ci.stats, bprof.ci.summary, bprof.ci.trend
from bprof.cli.main import main
sys.exit(main(sys.argv[2:] + ['--db', sys.argv[1]]))
"""


def _without_torch(tmp_path, *command: str) -> subprocess.CompletedProcess:
    from bprof.store.db import open_store

    open_store(tmp_path / "s.duckdb").close()
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH, str(tmp_path / "s.duckdb"), *command],
                          capture_output=True, text=True, timeout=120)


def test_store_and_cli_import_without_torch(tmp_path):
    done = _without_torch(tmp_path, "runs")
    assert done.returncode == 0, done.stderr
    assert "torch" not in done.stderr


def test_ci_gating_runs_without_torch(tmp_path):
    done = _without_torch(tmp_path, "ci", "trend")
    # an empty store: the command got as far as reading the history and said why it cannot answer
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "bprof: error: no series 'main' in the history (series: none yet)"
