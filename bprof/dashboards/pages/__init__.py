"""The report's pages. A page is a module with PATH, TITLE, CONTROLS (which of run, step, ranks,
base it uses), IN_HTML (whether the static export includes it: a bool, or a function of (con, run_id) for a page
only some runs have) and `sections(con, view)`.
Adding a page is a new module and one line in PAGES."""

from __future__ import annotations

from bprof.dashboards.pages import comm, compare, kernels, overview, ranks, runs, timeline, watch, whatif

PAGES = [runs, overview, ranks, comm, kernels, timeline, whatif, compare, watch]


def in_html(page, con, run_id: int) -> bool:
    """Whether the static export of run `run_id` includes `page`."""
    return page.IN_HTML(con, run_id) if callable(page.IN_HTML) else bool(page.IN_HTML)


def page_for(path: str | None):
    """The page at a URL path ('/' is the runs page); None when there is none."""
    path = (path or "/").rstrip("/") or "/"
    return next((p for p in PAGES if p.PATH == path), None)
