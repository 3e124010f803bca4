"""The code a long benchmark measures, fixed when it starts.

Benchmarks run bprof from this checkout; one that records for half an hour would pick up whatever
the tree holds when each child process starts, so an edit made meanwhile changes (or breaks) what
it measures. `snapshot` copies bprof/ and examples/ once, and the benchmark runs every child (and
its own imports) from the copy; `describe` names the commit, marked when the copied files differ
from it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

COPIED = ("bprof", "examples")


def snapshot(root: Path, into: Path) -> Path:
    """Copy root's bprof/ and examples/ under into/code and put the copy first on this process's
    import path; returns the copy's root. Call before anything imports bprof."""
    code = into / "code"
    shutil.rmtree(code, ignore_errors=True)
    for name in COPIED:
        shutil.copytree(root / name, code / name, ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(code))
    return code


def child_env(code: Path, **extra: str) -> dict[str, str]:
    """The environment of a child process that must import bprof from the copy. Start it in a folder
    outside the checkout: `python -m` puts its working directory first on the import path."""
    path = [str(code)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}


def describe(root: Path) -> str:
    """`git describe`-like: the short commit, '+uncommitted' when bprof/ or examples/ differ from it."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    rev = git("rev-parse", "--short", "HEAD") or "unknown commit"
    return rev + ("+uncommitted" if git("status", "--porcelain", "--", *COPIED) else "")
