"""The README and docs/ stay true: every relative link (and #anchor) resolves, and every `bprof ...`
command and --flag they show exists in the CLI (the check tests/ci/test_workflow.py makes of the
CI workflow)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.ci.test_workflow import GROUPS, assert_commands_exist

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", path.read_text(), re.M)}


def test_docs_exist_and_the_readme_is_short():
    assert (ROOT / "docs" / "README.md").exists() and len(PAGES) > 8
    assert len((ROOT / "README.md").read_bytes()) <= 12_000


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def shown_commands(text: str) -> list[list[str]]:
    """`bprof ...` as the page shows it: code spans, and code-block lines (a `$ ` prompt allowed);
    optional parts `[--flag X]` and alternatives `a|b` opened up, comments and output left out."""
    found = [m.group(1) for m in re.finditer(r"`bprof ([^`]+)`", text)]
    for line in text.splitlines():
        if line.startswith("    "):
            m = re.match(r"\s*(?:\$ )?bprof (.+)", line)
            if m:
                found.append(m.group(1))
    out = []
    for shown in found:
        shown = shown.split("  #")[0].split(" # ")[0].split(">")[0]
        shown = re.sub(r"[\[\]]", " ", shown)
        try:
            words = shlex.split(shown)
        except ValueError:
            words = shown.split()
        if not words or not re.fullmatch(r"[a-z][a-z|]*", words[0]):
            continue
        names = words[0].split("|")
        subs = words[1].split("|") if names[0] in GROUPS and len(words) > 1 else [None]
        for name in names:
            for sub in subs:
                head = [name] if sub is None else [name, sub]
                rest = words[2:] if sub is not None else words[1:]
                flags = [w.split("|")[0] for w in rest]
                out.append(head + flags)
    return out


def test_every_command_and_flag_shown_exists():
    commands = []
    for page in PAGES:
        commands += [(c, page.relative_to(ROOT)) for c in shown_commands(page.read_text())]
    names = {c[0] for c, _ in commands}
    assert {"record", "analyze", "whatif", "replay", "report", "ci"} <= names
    for page in PAGES:
        assert_commands_exist([c for c, p in commands if p == page.relative_to(ROOT)], str(page.relative_to(ROOT)))


def test_the_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    listed = {target.partition("#")[0] for target in LINK.findall(index)}
    missing = [p.name for p in PAGES[1:] if p.name != "README.md" and p.name not in listed]
    assert not missing, f"docs/README.md does not list {missing}"
