"""Robustness sweep: every trace of the real corpus goes through ingest -> analyze -> whatif (the default
scenarios) -> report --html -> export --perfetto, through the real CLI entry point (bprof.cli.main.main,
the function the `bprof` script runs), without an internal error.

An internal error propagates out of main() as an exception, so it fails the case with its traceback.
A command may also end with a documented non-zero exit code (3: the data cannot be judged) if it says
why in one line on stderr; ingest must succeed on every corpus trace.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json

import pytest

from bprof.cli.main import main
from tests.real.corpus import ingest_args, traces

FRACS = ("compute_frac", "exposed_comm_frac", "overlapped_comm_frac", "memcpy_frac", "idle_frac", "other_frac")
# trace id -> reason, for cases that fail today on a bug outside this test's reach (strict: a fix shows)
KNOWN_BUGS: dict[str, str] = {}


def bprof(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def check(command: str, rc: int, err: str, allowed=(0,)) -> None:
    assert rc in allowed, f"bprof {command}: exit {rc}: {err.strip()[-2000:]}"
    if rc != 0:
        lines = [line for line in err.splitlines() if not line.startswith("warning:")]
        assert len(lines) == 1 and lines[0].startswith("bprof: error: "), f"bprof {command}: exit {rc} without one line: {err!r}"


def cases() -> list:
    return [pytest.param(t, id=t["id"], marks=[pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[t["id"]])]
                         if t["id"] in KNOWN_BUGS else []) for t in traces()]


@pytest.mark.parametrize("trace", cases())
def test_every_command_runs_on_the_real_trace(tmp_path, trace):
    db = tmp_path / "s.duckdb"
    rc, out, err = bprof("ingest", *ingest_args(trace), "--db", db)
    check("ingest", rc, err)
    assert "ingested run 1" in out

    rc, out, err = bprof("analyze", "--db", db, "--json")
    check("analyze", rc, err)
    analysis = json.loads(out)
    assert len(analysis["ranks"]) >= 1
    for r in analysis["ranks"]:  # the partition's fractions sum to 1 wherever they are given
        fracs = [r.get(f) for f in FRACS]
        if all(f is not None for f in fracs):
            assert sum(fracs) == pytest.approx(1.0), f"rank {r.get('rank')}: {dict(zip(FRACS, fracs))}"
    assert all(f["lost_ns"] is None or f["lost_ns"] >= 0 for f in analysis["findings"])

    rc, out, err = bprof("whatif", "--db", db, "--json")
    check("whatif", rc, err, allowed=(0, 3))

    html = tmp_path / "report.html"
    rc, out, err = bprof("report", "--db", db, "--html", html)
    check("report --html", rc, err)
    assert html.stat().st_size > 0 and html.read_text(errors="replace").lstrip().lower().startswith("<!doctype html")

    perfetto = tmp_path / "step.json.gz"
    rc, out, err = bprof("export", "--db", db, "--perfetto", perfetto)
    check("export --perfetto", rc, err, allowed=(0, 3))
    if rc == 0:
        exported = json.load(gzip.open(perfetto, "rt"))
        assert exported["traceEvents"], "the exported step has no events"
