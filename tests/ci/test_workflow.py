"""examples/ci/bprof-ci.yml stays runnable: every bprof command it runs names a real command, and
every flag it passes is one that command accepts (read from the command's own --help)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "ci" / "bprof-ci.yml"
GROUPS = {"ci"}   # commands with subcommands


def workflow_commands() -> list[list[str]]:
    """The bprof invocations of the workflow's run blocks, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", WORKFLOW.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("- name:") or line.startswith("#"):
            continue
        m = re.search(r"(?:^|run: |\$\()bprof (.*)", line)
        if m:
            words = shlex.split(m.group(1).split(">")[0].split(")")[0])
            out.append(words)
    return out


def test_every_bprof_command_of_the_workflow_exists_with_its_flags():
    commands = workflow_commands()
    names = {" ".join(c[:2] if c[0] in GROUPS else c[:1]) for c in commands}
    assert {"record", "analyze", "report", "ci check", "ci record"} <= names   # the workflow's whole job
    for words in commands:
        command = words[:2] if words[0] in GROUPS else words[:1]
        done = subprocess.run([sys.executable, "-m", "bprof.cli.main", *command, "--help"], capture_output=True,
                              text=True, cwd=ROOT)
        assert done.returncode == 0, (command, done.stderr)
        own = words[:words.index("--")] if "--" in words else words   # after `--`: the launcher's command
        flags = [w.split("=")[0] for w in own if w.startswith("--")]
        assert flags
        for flag in flags:
            assert flag in done.stdout, f"bprof {' '.join(command)} has no {flag} (examples/ci/bprof-ci.yml)"
