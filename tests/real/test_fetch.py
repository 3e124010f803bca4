"""fetch.py keeps a corpus file only when its bytes match the pinned sha256, from a folder or a git mirror."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.real.corpus import REAL, by_id, rank_files

FETCH = REAL / "fetch.py"


def fetch(*args):
    return subprocess.run([sys.executable, str(FETCH), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_a_folder_source_is_checked_by_sha256(tmp_path):
    trace = by_id("mi210_gpu_only")  # a quick-set trace of 36 KB
    [real] = rank_files(trace)  # skips when the corpus was not fetched
    source = tmp_path / "src"
    source.mkdir()
    data = bytearray(real.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte off
    (source / real.name).write_bytes(bytes(data))
    refused = fetch("--from", source, "--offline", "--cache", tmp_path / "cache", "--only", trace["id"])
    assert refused.returncode == 1
    assert "folder: sha256 " in refused.stderr and not (tmp_path / "cache" / trace["id"] / ".verified").exists()

    (source / real.name).write_bytes(real.read_bytes())
    done = fetch("--from", source, "--offline", "--cache", tmp_path / "cache", "--only", trace["id"])
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "cache" / trace["id"] / real.name).read_bytes() == real.read_bytes()
    assert "present" in fetch("--cache", tmp_path / "cache", "--only", trace["id"], "--list").stdout


def test_a_git_mirror_source_extracts_an_archive(tmp_path):
    mirror = REAL.parents[3] / ".mirror"  # /work/.mirror beside the checkout, where the fetch tool puts them
    if not (mirror / "facebookresearch+param" / "repo").is_dir():
        pytest.skip(f"no git mirror of facebookresearch/param under {mirror}")
    done = fetch("--mirror", mirror, "--offline", "--cache", tmp_path, "--only", "v100_dlrm_8rank")
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in (tmp_path / "v100_dlrm_8rank").glob("*.json"))
    assert len(files) == 8 and files[0].startswith("worker0_step_12")
