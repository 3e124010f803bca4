"""CI gating runs on a machine without torch (a CI runner that only checks): prove it with torch blocked."""

from __future__ import annotations

import subprocess
import sys

BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == 'torch' or name.startswith('torch.'):
            raise ImportError('torch is blocked in this test')
sys.meta_path.insert(0, Block())
import bprof.ci.check, bprof.ci.causes, bprof.ci.history, bprof.ci.report, bprof.ci.stats, bprof.ci.summary, bprof.ci.trend
from bprof.cli.main import main
sys.exit(main(['ci', 'trend', '--db', sys.argv[1]]))
"""


def test_ci_imports_and_runs_without_torch(tmp_path):
    from bprof.store.db import open_store

    open_store(tmp_path / "s.duckdb").close()
    done = subprocess.run([sys.executable, "-c", BLOCK_TORCH, str(tmp_path / "s.duckdb")],
                          capture_output=True, text=True, timeout=120)
    # an empty store: the command got as far as reading the history and said why it cannot answer
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "bprof: error: no series 'main' in the history (series: none yet)"
