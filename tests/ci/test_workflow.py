"""examples/ci/bprof-ci.yml stays runnable: every bprof command it runs names a real command, and
every flag it passes is one that command accepts (read from the command's own --help)."""

from __future__ import annotations

import functools
import re
import shlex
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
        own = words[:words.index("--")] if "--" in words else words   # after `--`: the launcher's command
        assert [w for w in own if w.startswith("--")]
    assert_commands_exist(commands, "examples/ci/bprof-ci.yml")


@functools.lru_cache(maxsize=None)
def command_help(command: tuple[str, ...]) -> str:
    """`bprof COMMAND --help` (in-process, through Typer's runner), asserted to exist; wide, so that
    rich never folds a flag's name."""
    from typer.testing import CliRunner

    from bprof.cli.main import app

    done = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert done.exit_code == 0, (command, done.output)
    return done.output


def assert_commands_exist(commands: list[list[str]], source: str) -> None:
    """Each command (its words as shown) names a real bprof command, and each --flag before a `--`
    is one that command's --help lists. Also used by tests/test_docs.py for the README and docs/."""
    for words in commands:
        command = tuple(words[:2] if words[0] in GROUPS else words[:1])
        own = words[:words.index("--")] if "--" in words else words   # after `--`: the launcher's command
        flags = [w.split("=")[0] for w in own if w.startswith("--")]
        for flag in flags:
            assert flag in command_help(command), f"bprof {' '.join(command)} has no {flag} ({source})"
