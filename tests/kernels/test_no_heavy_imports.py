"""bprof.kernels is knowledge as data: it works with torch, duckdb and pandas all blocked."""

from __future__ import annotations

import subprocess
import sys

from .traces import ROOT

BLOCKED = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'duckdb', 'pandas', 'numpy'):
            raise ImportError(name + ' is blocked in this test')
sys.meta_path.insert(0, Block())
from bprof.kernels.classify import classify
from bprof.kernels.costs import op_cost
from bprof.kernels.devices import matmul_peak, resolve_device
assert classify('Memset (Device)', 'gpu_memset').coarse_class == 'memory'
assert op_cost('aten::mm', [[2, 3], [3, 4]], ['float', 'float']).flops == 48
peaks = resolve_device({'name': 'NVIDIA H200', 'computeMajor': 9, 'computeMinor': 0, 'numSms': 132,
                        'totalGlobalMem': 150754820096})
assert matmul_peak(peaks, 'c10::BFloat16')[0] == 989.5e12
print('ok')
"""


def test_kernels_import_without_torch_duckdb_pandas():
    done = subprocess.run([sys.executable, "-c", BLOCKED], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
