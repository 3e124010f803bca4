"""bprof as a user installs it: a wheel built from the source tree, installed into a fresh venv,
gives a working `bprof` with its package data (SQL, CSV, the report's stylesheet): --help, then
ingest, analyze and report --html of a small trace, run from the installed copy, not the checkout.

The fresh venv gets the wheel alone (--no-deps); its dependencies are read from this venv's
site-packages through a path file, so the test needs no network."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.store.tiny_traces import modern_trace, write

ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    # the installed copy alone: a PYTHONPATH pointing at a source tree would shadow it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-3000:])
    return done


def test_wheel_installs_a_working_bprof_with_its_data(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "bprof", src / "bprof", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheels, src, cwd=tmp_path)
    [wheel] = wheels.glob("bprof-*.whl")

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    py = venv / "bin" / "python"
    site = Path(run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).stdout.strip())
    (site / "deps-from-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(py, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel, cwd=tmp_path)

    where = run(py, "-c", "import bprof; print(bprof.__file__)", cwd=tmp_path).stdout.strip()
    assert Path(where).is_relative_to(site), where   # the installed copy, not the checkout
    bprof = venv / "bin" / "bprof"
    assert "analyze" in run(bprof, "--help", cwd=tmp_path).stdout
    for rank in range(2):
        write(tmp_path / "job" / f"rank{rank}.json.gz", modern_trace(rank))
    db = tmp_path / "s.duckdb"
    run(bprof, "ingest", tmp_path / "job", "--db", db, "--name", "tiny", cwd=tmp_path)
    analysed = run(bprof, "analyze", "tiny", "--db", db, "--json", cwd=tmp_path).stdout
    assert '"findings"' in analysed
    run(bprof, "report", "tiny", "--db", db, "--html", tmp_path / "r.html", cwd=tmp_path)
    assert "<style>" in (tmp_path / "r.html").read_text()
