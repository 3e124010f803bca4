"""bprof.synth stands alone: no torch, no duckdb, nothing else from bprof."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import bprof.synth
bad = sorted(m for m in sys.modules
             if m.split('.')[0] in ('torch', 'duckdb', 'pandas')
             or (m.startswith('bprof.') and not m.startswith('bprof.synth')))
print(bad)
sys.exit(1 if bad else 0)
"""


def test_synth_imports_nothing_outside_itself():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
