"""Options shared by several commands, so each is spelled and documented once."""

from __future__ import annotations

from pathlib import Path

import typer

from bprof.errors import UsageError
from bprof.store.db import DEFAULT_DB, open_store

DbOption = typer.Option(DEFAULT_DB, "--db", help="The bprof store (a DuckDB file).")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of a table.")
RunArgument = typer.Argument(None, help="Run id or name; default: the latest run.")
# CI history labels of a run (bprof record, bprof ingest)
BenchmarkOption = typer.Option(None, "--benchmark", help="Benchmark name: bprof ci compares only runs of the same benchmark.")
TagOption = typer.Option(None, "--tag", help="A free-form label of the run (repeatable).")
BranchOption = typer.Option(None, "--branch", help="Git branch of the measured code (default: what git says where the "
                                                   "capture ran; in a detached checkout, $GITHUB_HEAD_REF or $GITHUB_REF_NAME).")
CommitOption = typer.Option(None, "--commit", help="Git commit of the measured code (default: what git says where the capture ran).")


def print_json(value) -> None:
    import orjson

    typer.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str).decode())


def open_existing_store(db: Path):
    """The store at `db` opened for writing, which must exist: only `bprof ingest` and `bprof record`
    (and `bprof calibrate`, which stores what it measured) create a store, so a mistyped --db leaves
    no empty file behind."""
    if not Path(db).exists():
        raise UsageError(f"{db}: no bprof store here (create one with `bprof record` or `bprof ingest`, or pass --db)")
    return open_store(db)


def check_store_can_be_created(db: Path) -> None:
    """Refuse, before any work, a --db whose folder is missing: for the commands that create the
    store only once they have something to put in it (`bprof calibrate` after measuring)."""
    folder = Path(db).parent
    if not folder.is_dir():
        raise UsageError(f"{db}: cannot create a bprof store here ({folder} is not a folder)")
