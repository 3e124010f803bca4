"""The `bprof` command: a Typer app whose command groups live one per module."""

from __future__ import annotations

import sys

import typer

from bprof.cli import analyze, calibrate, ci, export, hang, ingest, record, reduce, replay, report, runs, whatif
from bprof.errors import BprofError

app = typer.Typer(
    name="bprof",
    help="Where the time of a distributed training step goes, on every rank.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
ingest.register(app)
analyze.register(app)
runs.register(app)
export.register(app)
record.register(app)
calibrate.register(app)
reduce.register(app)
ci.register(app)
replay.register(app)
report.register(app)
whatif.register(app)
hang.register(app)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; a BprofError becomes one line on stderr and its exit code (--debug: traceback)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    try:
        # without standalone mode, click returns a command's typer.Exit code instead of raising it
        rc = app(args, standalone_mode=False)
    except BprofError as exc:
        if debug:
            raise
        print(f"bprof: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("bprof: interrupted", file=sys.stderr)
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    except Exception as exc:
        # Typer's own (vendored click) usage errors: show them as click would, exit 2
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            return exc.exit_code
        if type(exc).__name__ == "Abort":
            return 1
        raise
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
