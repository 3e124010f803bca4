"""bprof calibrate: a real (small) measurement on this CPU, stored and read back; its refusals."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest
import torch

from bprof.errors import DeviceError, UsageError
from bprof.replay.calibrate import _cpu_model_name, _timed_batches, calibrate, normalise_dtype, spread_frac
from bprof.store.db import open_store
from bprof.store.peaks import cpu_peak_for_host, load_peaks
from tests.cli.test_cli import bprof
from tests.test_no_torch import TORCH_BLOCKER


def test_small_cpu_calibration_measures_each_dtype_and_restores_threads():
    threads_before = torch.get_num_threads()
    peaks = calibrate("cpu", dtypes=("fp32", "bfloat16"), num_threads=1, size=128, repeats=3,
                      min_time_s=0.02, copy_bytes=8 * 2**20)
    assert torch.get_num_threads() == threads_before
    assert [p.dtype for p in peaks] == ["fp32", "bf16"]
    for p in peaks:
        assert (p.host, p.device_kind, p.device_name) == (socket.gethostname(), "cpu", _cpu_model_name())
        assert (p.num_threads, p.matmul_size, p.num_repeats, p.torch_version) == (1, 128, 3, torch.__version__)
        # positive and below a petaflop: a unit slip (ms for s, n^2 for n^3) would leave this range
        assert 0 < p.flops_per_s < 1e15
        assert 0 < p.mem_bytes_per_s < 1e14
        assert p.flops_per_s_spread_frac is not None and p.flops_per_s_spread_frac >= 0
        assert p.measured_at.tzinfo is not None
    assert peaks[0].mem_bytes_per_s == peaks[1].mem_bytes_per_s  # one copy measurement per call


def test_every_batch_lasts_at_least_min_time():
    calls, seconds = _timed_batches(None, torch.device("cpu"), lambda: time.sleep(0.01), repeats=2, min_time_s=0.05)
    assert calls >= 5
    assert len(seconds) == 2 and all(s >= 0.05 for s in seconds)


def test_spread_and_dtype_names():
    assert spread_frac([1.0, 2.0, 3.0]) == 1.0
    assert spread_frac([4.0, 5.0]) == pytest.approx(0.2222222)
    assert spread_frac([5.0]) is None
    assert [normalise_dtype(n) for n in ("FP32", "float32", "bfloat16", "half", "tf32")] == ["fp32", "fp32", "bf16", "fp16", "tf32"]
    with pytest.raises(UsageError, match="unknown dtype 'int8'"):
        normalise_dtype("int8")


def test_refusals():
    with pytest.raises(UsageError, match="tf32 is a CUDA matmul mode"):
        calibrate("cpu", dtypes=["tf32"])
    with pytest.raises(UsageError, match="size must be at least 1, not 0"):
        calibrate("cpu", size=0)
    with pytest.raises(UsageError, match="unknown device 'tpu'"):
        calibrate("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="CUDA is not available"):
            calibrate("cuda")


def test_cli_stores_what_it_prints(tmp_path):
    db = tmp_path / "s.duckdb"
    done = bprof("calibrate", "--db", db, "--json", "--dtype", "fp32", "--repeats", "2")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert [(p["device_kind"], p["dtype"], p["num_repeats"]) for p in printed] == [("cpu", "fp32", 2)]
    con = open_store(db, read_only=True)
    try:
        stored = load_peaks(con)
        assert [(p.host, p.dtype, p.flops_per_s, p.mem_bytes_per_s, p.flops_per_s_spread_frac) for p in stored] == [
            (printed[0]["host"], "fp32", printed[0]["flops_per_s"], printed[0]["mem_bytes_per_s"],
             printed[0]["flops_per_s_spread_frac"])]
        assert stored[0].flops_per_s > 0
        assert cpu_peak_for_host(con, socket.gethostname(), "fp32") == stored[0]
    finally:
        con.close()


def test_cli_errors_are_one_line(tmp_path):
    no_cuda = bprof("calibrate", "--db", tmp_path / "s.duckdb", "--device", "cuda")
    if not torch.cuda.is_available():
        assert no_cuda.returncode == 4
        assert no_cuda.stderr.startswith("bprof: error: device 'cuda': CUDA is not available (torch ")
        assert len(no_cuda.stderr.splitlines()) == 1
    assert bprof("calibrate", "--db", tmp_path / "s.duckdb", "--threads", "0").returncode == 2


BLOCK_TORCH = TORCH_BLOCKER + """from bprof.cli.main import main
sys.exit(main(['calibrate', '--db', sys.argv[1]]))
"""


def test_without_torch_says_how_to_install_it(tmp_path):
    done = subprocess.run([sys.executable, "-c", BLOCK_TORCH, str(tmp_path / "s.duckdb")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().endswith("calibration needs torch: pip install 'bprof[capture]'")
    assert list(tmp_path.iterdir()) == []   # nothing measured, so no store created


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_calibration_measures_tf32_and_restores_the_switch():
    before = torch.backends.cuda.matmul.allow_tf32
    peaks = calibrate("cuda", size=2048, repeats=2, min_time_s=0.02)
    assert torch.backends.cuda.matmul.allow_tf32 == before
    assert [p.dtype for p in peaks] == ["fp32", "tf32", "bf16", "fp16"]
    assert all(p.device_kind == "cuda" and p.device_name == torch.cuda.get_device_name() for p in peaks)
    assert all(0 < p.flops_per_s < 1e17 and 0 < p.mem_bytes_per_s < 1e14 for p in peaks)
