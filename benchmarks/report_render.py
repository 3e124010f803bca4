"""Time to first render of the report's overview for a large run, against a small run served by
the same server in the same run of this script (this machine is shared and noisy: read the ratio).

    .venv/bin/python benchmarks/report_render.py                    # 1,024 ranks vs 8, 5 loads each
    .venv/bin/python benchmarks/report_render.py --ranks 4096 --repeats 3
    .venv/bin/python benchmarks/report_render.py --screenshots docs/report   # also one PNG per page

Builds one store in a temporary folder: the synthetic 8-GPU run (`python -m bprof.synth`, tp2 pp2
dp2, two hosts; the baseline; also given to `bprof whatif`) and a fleet run of --ranks ranks (bprof.synth.fleet: TP8 x PP4 x DP,
4 micro-batches, 3 steps, one slow rank), both analysed. Then `bprof report --serve` over it and a
headless Chromium (Debian's chromium + chromedriver through Selenium) with its cache disabled loads
/overview of each run alternately, --repeats times.

Printed per run: time to first render (from the navigation until the headline and the split chart
are drawn and Dash has no callback in flight; median and range over the loads), bytes the page
fetched (compressed, as sent), and the large run's median over the small run's. Then, for the large
run, the same for every page.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.dashboards.browser import new_driver, serving, transferred_bytes, wait_for, wait_idle  # noqa: E402


def build_store(folder: Path, ranks: int) -> tuple[Path, int, int]:
    from bprof.analyzers import run as analysis
    from bprof.analyzers.base import Options
    from bprof.store.db import open_store
    from bprof.synth.fleet import Fleet, write_fleet

    if ranks % 32:
        raise SystemExit(f"--ranks {ranks}: must be a multiple of 32 (TP8 x PP4 x DP)")
    db = folder / "report.duckdb"
    bprof = [sys.executable, "-m", "bprof.cli.main"]
    subprocess.run([sys.executable, "-m", "bprof.synth", str(folder / "synthetic"), "--tp", "2", "--pp", "2",
                    "--dp", "2", "--hosts", "2", "--slow-rank", "3"], check=True, capture_output=True, cwd=ROOT)
    subprocess.run([*bprof, "ingest", str(folder / "synthetic"), "--db", str(db), "--name", "synthetic-8"],
                   check=True, capture_output=True, cwd=ROOT)
    subprocess.run([*bprof, "analyze", "synthetic-8", "--db", str(db)], check=True, capture_output=True, cwd=ROOT)
    subprocess.run([*bprof, "whatif", "synthetic-8", "--db", str(db), "--scenario", "no-host-gaps", "--scenario",
                    "perfect-overlap", "--scenario", "scale:gemm=0.8"], check=True, capture_output=True, cwd=ROOT)
    con = open_store(db)
    t0 = time.perf_counter()
    truth = write_fleet(con, Fleet(tp=8, pp=4, dp=ranks // 32, microbatches=4, steps=3, tp_per_forward=6,
                                   tp_per_backward=12, dp_collectives=4, slow_rank=333 % ranks, slow_factor=1.3),
                        name=f"fleet-{ranks}")
    analysis.analyze_run(con, truth.run_id, Options())
    print(f"store: synthetic-8 and fleet-{ranks} generated and analysed in {time.perf_counter() - t0:.1f} s")
    small = con.execute("SELECT run_id FROM runs WHERE name = 'synthetic-8'").fetchone()[0]
    con.close()
    return db, small, truth.run_id


def load(driver, url: str, ready_css: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    driver.get(url)
    wait_for(driver, ready_css, timeout_s=300)
    wait_idle(driver, timeout_s=300)
    return time.perf_counter() - t0, transferred_bytes(driver)


def fresh_driver():
    d = new_driver()
    d.execute_cdp_cmd("Network.enable", {})
    d.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
    return d


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--screenshots", type=Path, help="write one PNG per page of each run here")
    args = p.parse_args()
    from bprof.dashboards.pages import PAGES

    with tempfile.TemporaryDirectory(dir=ROOT.parent / "scratch" if (ROOT.parent / "scratch").exists() else None) as tmp:
        db, small, large = build_store(Path(tmp), args.ranks)
        times: dict[int, list[float]] = {small: [], large: []}
        sent: dict[int, int] = {}
        for i in range(args.repeats):
            for run_id in ((small, large) if i % 2 == 0 else (large, small)):
                with serving(db, str(run_id)) as url:
                    d = fresh_driver()
                    try:
                        seconds, n = load(d, url + "/overview", "#split .js-plotly-plot .main-svg")
                    finally:
                        d.quit()
                times[run_id].append(seconds)
                sent[run_id] = n
        print(f"\ntime to first render of /overview (median [min..max] over {args.repeats} cold loads)")
        for run_id, label in ((small, "synthetic 8 ranks (baseline)"), (large, f"fleet {args.ranks:,} ranks")):
            t = times[run_id]
            print(f"  {label:32s} {statistics.median(t):6.2f} s [{min(t):.2f}..{max(t):.2f}]  {sent[run_id] / 1e6:.2f} MB sent")
        print(f"  ratio large / baseline: {statistics.median(times[large]) / statistics.median(times[small]):.2f}")

        print(f"\nevery page of the {args.ranks:,}-rank run, cold (seconds to drawn, MB sent, charts drawn)")
        for run_id in (large, small):
            with serving(db, str(run_id)) as url:
                for page in PAGES:
                    d = fresh_driver()
                    try:
                        seconds, n = load(d, url + page.PATH, "main h2")
                        charts = len(d.find_elements("css selector", "main .js-plotly-plot"))
                        problems = [e.text for e in d.find_elements("css selector", "main .warning")]
                        if args.screenshots:
                            args.screenshots.mkdir(parents=True, exist_ok=True)
                            name = "fleet" if run_id == large else "synthetic"
                            height = d.execute_script("return document.body.scrollHeight")
                            d.set_window_size(1400, min(max(height, 800), 4000))
                            d.save_screenshot(str(args.screenshots / f"{name}-{page.__name__.rsplit('.', 1)[-1]}.png"))
                    finally:
                        d.quit()
                    if run_id == large:
                        print(f"  {page.PATH:10s} {seconds:6.2f} s  {n / 1e6:.2f} MB  {charts} charts"
                              + (f"  warning: {'; '.join(problems)}" if problems else ""))


if __name__ == "__main__":
    main()
