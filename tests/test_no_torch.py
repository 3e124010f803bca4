"""Analysis, store and CLI work on a machine without torch: prove it with torch blocked."""

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
import bprof, bprof.store.ingest, bprof.store.runs, bprof.analyzers, bprof.dashboards, bprof.kernels, bprof.cli.main
from bprof.cli.main import main
sys.exit(main(['runs', '--db', sys.argv[1]]))
"""


def test_store_and_cli_import_without_torch(tmp_path):
    from bprof.store.db import open_store

    open_store(tmp_path / "s.duckdb").close()
    done = subprocess.run([sys.executable, "-c", BLOCK_TORCH, str(tmp_path / "s.duckdb")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch" not in done.stderr
