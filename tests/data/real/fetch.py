"""Fetch the corpus of real public traces (corpus.json) into tests/data/real/cache/ (git-ignored).

Stdlib only. Every file is pinned to a commit of its public repository and checked by sha256 before
it is kept. Three sources, tried in this order for each file:

    --from DIR     a folder holding the files, as DIR/<owner>/<name>/<path> or DIR/<file name>
    --mirror DIR   local bare git mirrors, as DIR/<owner>+<name>/repo (the layout of /work/.mirror),
                   DIR/<owner>+<name> or DIR/<owner>/<name>; read with `git show <commit>:<path>`
    (default)      https://raw.githubusercontent.com/<owner>/<name>/<commit>/<path>

    python tests/data/real/fetch.py                       # raw GitHub
    python tests/data/real/fetch.py --mirror /work/.mirror
    python tests/data/real/fetch.py --only b200_vllm_tp8_rank0 --list

A `.tar.gz` entry marked "extract" is unpacked (its regular files, flattened) into the trace's folder.
Exit 0 when every requested trace is present and verified, 1 when any is missing or fails its check.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "corpus.json"
CACHE = HERE / "cache"
DONE = ".verified"  # a trace folder's record of the sha256s it was built from


def traces() -> list[dict]:
    return json.loads(MANIFEST.read_text())["traces"]


def trace_dir(trace_id: str, cache: Path = CACHE) -> Path:
    return cache / trace_id


def is_fetched(trace: dict, cache: Path = CACHE) -> bool:
    marker = trace_dir(trace["id"], cache) / DONE
    return marker.is_file() and marker.read_text().split() == [f["sha256"] for f in trace["files"]]


def from_folder(root: Path, repo: str, path: str) -> bytes | None:
    for candidate in (root / repo / path, root / Path(path).name):
        if candidate.is_file():
            return candidate.read_bytes()
    return None


def from_mirror(root: Path, repo: str, commit: str, path: str) -> bytes | None:
    owner, name = repo.split("/")
    for git_dir in (root / f"{owner}+{name}" / "repo", root / f"{owner}+{name}", root / owner / name):
        if not git_dir.is_dir():
            continue
        done = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"],
                              capture_output=True)
        if done.returncode == 0:
            return done.stdout
    return None


def from_github(repo: str, commit: str, path: str) -> bytes | None:
    url = f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.read()
    except OSError as exc:
        print(f"  {url}: {exc}", file=sys.stderr)
        return None


def get(trace: dict, entry: dict, args) -> tuple[bytes | None, str]:
    """The file's bytes and where they came from; None when no source has it with the right sha256."""
    tried = []
    sources = []
    if args.from_dir:
        sources.append(("folder", lambda: from_folder(args.from_dir, trace["repo"], entry["path"])))
    if args.mirror:
        sources.append(("mirror", lambda: from_mirror(args.mirror, trace["repo"], trace["commit"], entry["path"])))
    if not args.offline:
        sources.append(("github", lambda: from_github(trace["repo"], trace["commit"], entry["path"])))
    for label, read in sources:
        data = read()
        if data is None:
            tried.append(f"{label}: not found")
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"]:
            tried.append(f"{label}: sha256 {digest[:12]}… is not {entry['sha256'][:12]}…")
            continue
        return data, label
    return None, "; ".join(tried) or "no source given"


def place(trace: dict, entry: dict, data: bytes, cache: Path) -> list[Path]:
    out = trace_dir(trace["id"], cache)
    out.mkdir(parents=True, exist_ok=True)
    if not entry.get("extract"):
        target = out / Path(entry["path"]).name
        target.write_bytes(data)
        return [target]
    written = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member in archive.getmembers():
            name = Path(member.name).name
            if not member.isfile() or name.startswith("."):
                continue
            target = out / name
            target.write_bytes(archive.extractfile(member).read())
            written.append(target)
    return written


def fetch(trace: dict, args) -> bool:
    if is_fetched(trace, args.cache) and not args.force:
        print(f"{trace['id']}: present")
        return True
    blobs = []
    for entry in trace["files"]:
        data, source = get(trace, entry, args)
        if data is None:
            print(f"{trace['id']}: {trace['repo']}@{trace['commit'][:10]}:{entry['path']}: {source}", file=sys.stderr)
            return False
        blobs.append((entry, data, source))
    for entry, data, source in blobs:
        for path in place(trace, entry, data, args.cache):
            print(f"{trace['id']}: {path} ({path.stat().st_size:,} bytes, from {source})")
    (trace_dir(trace["id"], args.cache) / DONE).write_text("\n".join(f["sha256"] for f in trace["files"]) + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="from_dir", type=Path, help="a folder holding the files")
    parser.add_argument("--mirror", type=Path, help="a folder of bare git mirrors (owner+name/repo)")
    parser.add_argument("--offline", action="store_true", help="never try raw GitHub")
    parser.add_argument("--only", nargs="+", metavar="ID", help="fetch only these trace ids")
    parser.add_argument("--force", action="store_true", help="fetch again even when present")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"where the traces go (default {CACHE})")
    parser.add_argument("--list", action="store_true", help="list the corpus and whether each trace is present")
    args = parser.parse_args(argv)
    chosen = [t for t in traces() if not args.only or t["id"] in args.only]
    unknown = set(args.only or ()) - {t["id"] for t in chosen}
    if unknown:
        parser.error(f"unknown trace id(s): {', '.join(sorted(unknown))}")
    if args.list:
        for t in chosen:
            print(f"{t['id']:36} {'present' if is_fetched(t, args.cache) else 'missing':8} {t['repo']}@{t['commit'][:10]}")
        return 0
    ok = [fetch(t, args) for t in chosen]
    print(f"{sum(ok)} of {len(ok)} traces present in {args.cache}")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
