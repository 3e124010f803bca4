"""Options shared by several commands, so each is spelled and documented once."""

from __future__ import annotations


import typer

from bprof.store.db import DEFAULT_DB

DbOption = typer.Option(DEFAULT_DB, "--db", help="The bprof store (a DuckDB file).")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of a table.")
RunArgument = typer.Argument(None, help="Run id or name; default: the latest run.")


def print_json(value) -> None:
    import orjson

    typer.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str).decode())
