"""Options shared by several commands, so each is spelled and documented once."""

from __future__ import annotations


import typer

from bprof.store.db import DEFAULT_DB

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
