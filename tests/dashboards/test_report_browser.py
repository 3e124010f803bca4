"""The web report in a real headless Chromium: content, not just "no errors". Each test starts
`bprof report --serve` over a session store (conftest.py) and reads what the browser shows."""

from __future__ import annotations

import hashlib
import json

import pytest

from bprof.dashboards import format as fmt
from bprof.dashboards.pages import PAGES
from tests.dashboards.browser import (choose, clear, console_errors, figure_data, new_driver, serving, transferred_bytes,
                                      wait_for, wait_idle)
from tests.dashboards.conftest import FLEET_RANKS

MAX_PAGE_BYTES = 5_000_000


@pytest.fixture(scope="module")
def driver():
    d = new_driver()
    yield d
    d.quit()


def open_page(driver, url: str) -> None:
    driver.get(url)
    wait_for(driver, "main h2")
    wait_idle(driver)


def headline(driver) -> dict[str, str]:
    return {key: driver.find_element("id", f"headline-{key}").text
            for key in ("step_time_ns", "mfu_frac", "top-finding")}


def test_overview_shows_what_bprof_analyze_json_says(driver, recorded_store):
    data = recorded_store["analyze"]
    with serving(recorded_store["db"]) as url:
        open_page(driver, url + "/overview")
        shown = headline(driver)
        first_row = driver.find_element("css selector", "#findings tbody tr").text
    top = data["findings"][0]
    assert data["metrics"]["mfu_frac"]["value"] is not None   # calibrated: MFU is a number, not "not measurable"
    assert shown["step_time_ns"] == fmt.ms(data["metrics"]["step_time_ns"]["value"])
    assert shown["mfu_frac"] == fmt.pct(data["metrics"]["mfu_frac"]["value"])
    assert shown["top-finding"] == f"{top['title']} ({fmt.ms(top['lost_ns'])})"
    assert first_row.startswith(fmt.ms(top["lost_ns"])) and top["title"] in first_row
    assert console_errors(driver) == []


def test_ranks_heatmaps_of_a_1024_rank_run_have_a_row_per_rank(driver, report_store):
    with serving(report_store["db"], str(report_store["fleet"])) as url:
        open_page(driver, url + "/ranks")
        for key in ("heatmap-span_ns", "heatmap-exposed_comm_ns", "heatmap-idle_ns", "heatmap-exposed_wait_ns"):
            [trace] = [t for t in figure_data(driver, key) if t["type"] == "heatmap"]
            assert len(trace["z"]) == FLEET_RANKS and len(set(trace["y"])) == FLEET_RANKS, key
            assert len(trace["z"][0]) == 3   # steps
        # any rank is reachable by typing, though the picker lists 200 at a time
        clear(driver, "ranks")
        choose(driver, "ranks", "1000 (node125)")
        wait_for(driver, "#rank-steps h3", text="Steps of rank 1000")
    assert console_errors(driver) == []


def test_choosing_run_rank_and_step_changes_what_is_drawn(driver, report_store):
    synthetic, fleet = report_store["synthetic"], report_store["fleet"]
    with serving(report_store["db"], str(synthetic)) as url:
        open_page(driver, url + "/overview")
        assert driver.find_element("id", "run-facts-run").text == f"{synthetic} synthetic-8"
        before = headline(driver)
        choose(driver, "run", f"{fleet} fleet-1024")
        wait_for(driver, "#run-facts-run", text="fleet-1024")
        wait_idle(driver)
        assert headline(driver)["step_time_ns"] != before["step_time_ns"]

        choose(driver, "run", f"{synthetic} synthetic-8")
        wait_for(driver, "#run-facts-run", text="synthetic-8")
        driver.find_element("id", "nav-timeline").click()
        wait_for(driver, "#timeline .js-plotly-plot")
        wait_idle(driver)
        title = driver.find_element("css selector", "#timeline .gtitle").text
        step = int(title.split()[1])
        other = next(s for s in (5, 6, 7) if s != step)
        choose(driver, "step", str(other))
        wait_for(driver, "#timeline .gtitle", text=f"Step {other} ")
        wait_idle(driver)
        lanes = {y for t in figure_data(driver, "timeline") for y in (t.get("y") or []) if y}
        clear(driver, "ranks")
        wait_idle(driver)
        choose(driver, "ranks", "5 (node1)")
        wait_for(driver, "#timeline .gtitle", text="on rank 5 ")
        wait_idle(driver)
        now = {y for t in figure_data(driver, "timeline") for y in (t.get("y") or []) if y}
        assert now != lanes and {lane.split()[0] for lane in now} == {"r5"}

        driver.find_element("id", "nav-ranks").click()
        wait_for(driver, "#rank-steps h3", text="Steps of rank 5")
    assert console_errors(driver) == []


def test_a_kernel_name_with_markup_shows_as_text(driver, report_store):
    with serving(report_store["db"], str(report_store["synthetic"])) as url:
        open_page(driver, url + "/kernels")
        table = driver.find_element("id", "kernel-top").text
        pwned = driver.execute_script("return window.__bprof_pwned === undefined ? null : window.__bprof_pwned")
    assert report_store["hostile"].split("</script>")[0] in table   # the name's text, tags and all
    assert pwned is None


def test_no_page_ships_more_than_5_mb_and_none_logs_an_error(report_store):
    """Every page of the 1,024-rank run loaded into a fresh browser (nothing cached)."""
    db = report_store["db"]
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    sizes = {}
    with serving(db, str(report_store["fleet"])) as url:
        for page in PAGES:
            d = new_driver()
            try:
                d.execute_cdp_cmd("Network.enable", {})
                d.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
                open_page(d, url + page.PATH)
                sizes[page.PATH] = transferred_bytes(d)
                assert console_errors(d) == [], page.PATH
                assert not d.find_elements("id", "page-error"), d.find_element("id", "page-error").text
            finally:
                d.quit()
    assert all(0 < n <= MAX_PAGE_BYTES for n in sizes.values()), sizes
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before   # served read-only


def test_html_export_opens_offline_with_the_same_headline(driver, recorded_store, tmp_path):
    from tests.dashboards.conftest import bprof

    html_file = tmp_path / "report.html"
    bprof("report", "--db", str(recorded_store["db"]), "--html", str(html_file))
    driver.get(html_file.as_uri())
    wait_for(driver, "#split .js-plotly-plot")
    data = recorded_store["analyze"]
    top = data["findings"][0]
    assert headline(driver) == {"step_time_ns": fmt.ms(data["metrics"]["step_time_ns"]["value"]),
                                "mfu_frac": fmt.pct(data["metrics"]["mfu_frac"]["value"]),
                                "top-finding": f"{top['title']} ({fmt.ms(top['lost_ns'])})"}
    fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert [u for u in fetched if not u.startswith("file:")] == []   # nothing from the network
    drawn = driver.execute_script("return document.querySelectorAll('.js-plotly-plot').length")
    assert drawn == len(driver.find_elements("css selector", "[id^='graph-']")) >= 8
    assert console_errors(driver) == []


def test_a_findings_evidence_link_opens_its_ranks_and_step_in_the_timeline(driver, report_store):
    from bprof.dashboards.read import findings
    from bprof.store.db import open_store

    con = open_store(report_store["db"], read_only=True)
    try:
        ranked = findings(con, report_store["synthetic"])
    finally:
        con.close()
    evidence = [json.loads(f["evidence"] or "{}") for f in ranked]
    first = next(i for i, e in enumerate(evidence) if e.get("ranks") and e.get("steps"))
    ranks, step = sorted(evidence[first]["ranks"])[:16], evidence[first]["steps"][0]
    with serving(report_store["db"], str(report_store["fleet"])) as url:   # the server starts on the other run
        open_page(driver, url + f"/overview?run={report_store['synthetic']}")
        wait_for(driver, "#run-facts-run", text="synthetic-8")
        rows = driver.find_elements("css selector", "#findings tbody tr")
        # the evidence reads as text (ranks, steps, numbers with units); its raw JSON opens on a click
        cell = rows[first].find_element("css selector", "details.evidence")
        summary = cell.find_element("tag name", "summary").text
        assert summary.startswith("rank") and "step" in summary and "{" not in summary, summary
        raw = cell.find_element("css selector", "pre.raw")
        assert not raw.is_displayed()
        cell.find_element("tag name", "summary").click()
        assert raw.is_displayed()
        assert json.loads(raw.text) == {k: v for k, v in evidence[first].items() if k != "advice"}
        rows[first].find_element("link text", "timeline").click()
        expected = f"Step {step} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
        wait_for(driver, "#timeline .gtitle", text=expected)
        assert "/timeline?" in driver.current_url
        # plain navigation keeps what the link chose
        driver.find_element("id", "nav-ranks").click()
        wait_for(driver, "#rank-steps h3", text=f"Steps of rank {ranks[0]}")
    assert console_errors(driver) == []


def test_the_timeline_downloads_its_step_as_a_perfetto_trace(report_store, tmp_path):
    """The button on the timeline page sends `bprof export --perfetto` of the shown step and ranks."""
    import gzip
    import time

    d = new_driver()
    try:
        d.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)})
        with serving(report_store["db"], str(report_store["synthetic"])) as url:
            open_page(d, url + "/timeline?ranks=0,1,5&step=6")
            wait_for(d, "#timeline .gtitle", text="Step 6 on ranks 0, 1, 5 ")
            d.find_element("id", "download-button").click()
            wait_for(d, "#download-message", text="events")
            deadline = time.monotonic() + 60
            while not list(tmp_path.glob("*.json.gz")) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert console_errors(d) == []
    finally:
        d.quit()
    [got] = list(tmp_path.glob("*.json.gz"))
    assert got.name == f"bprof-run{report_store['synthetic']}-step6.json.gz"
    trace = json.loads(gzip.decompress(got.read_bytes()))
    assert trace["bprofExport"]["step"] == 6 and [r["rank"] for r in trace["bprofExport"]["ranks"]] == [0, 1, 5]
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1, 5}
    from bprof.store.chrome_export import FLOW_CAT

    assert any(e["ph"] == "s" and e["cat"] == FLOW_CAT for e in trace["traceEvents"])   # matched collectives linked
