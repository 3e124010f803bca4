"""`bprof analyze [RUN]`: run every analyzer, then print step time, MFU/HFU, the partition and the
findings ranked by recoverable time."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from bprof.analyzers import between
from bprof.analyzers.base import Options
from bprof.analyzers.run import analyze_run, summary
from bprof.cli.between import print_between
from bprof.cli.options import DbOption, JsonOption, RunArgument, print_json, open_existing_store
from bprof.cli.tables import Grid
from bprof.dashboards.format import pct as _pct
from bprof.errors import UsageError
from bprof.store.limits import set_memory_limit
from bprof.store.runs import resolve_run


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)


def analyze(
    run: Optional[str] = RunArgument,
    db: Path = DbOption,
    as_json: bool = JsonOption,
    peak_tflops: Optional[float] = typer.Option(
        None, "--peak-tflops", help="Dense peak TFLOP/s per device at the matmul dtype (overrides the tables and calibration)."),
    nic_gbps: Optional[float] = typer.Option(
        None, "--nic-gbps", help="Inter-host link per GPU, Gbit/s each way (e.g. 400 for NDR InfiniBand): the peak that "
                                 "collectives crossing hosts are compared with. Intra-host NVLink peaks come from the device table."),
    tokens_per_step: Optional[int] = typer.Option(None, "--tokens-per-step", help="Tokens per optimizer step (global batch), when the run did not declare it."),
    top: int = typer.Option(10, "--top", help="Findings to print."),
    hta_compat: bool = typer.Option(False, "--hta-compat", help="Also compute HolisticTraceAnalysis 0.5's whole-trace breakdown (for parity checks)."),
    memory_limit: Optional[str] = typer.Option(
        None, "--memory-limit", help="DuckDB's memory limit while analysing (e.g. 4GB); past it DuckDB spills to disk. "
                                     "Default: DuckDB's, 80% of the machine's memory."),
) -> None:
    """Analyze a run: where each rank's step time goes, MFU/HFU, and findings ranked by lost time."""
    if peak_tflops is not None and peak_tflops <= 0:
        raise UsageError(f"--peak-tflops must be positive, got {peak_tflops}")
    if nic_gbps is not None and nic_gbps <= 0:
        raise UsageError(f"--nic-gbps must be positive, got {nic_gbps}")
    options = Options(peak_flops_per_s=None if peak_tflops is None else peak_tflops * 1e12,
                      nic_bytes_per_s=None if nic_gbps is None else nic_gbps * 1e9 / 8,
                      hta_compat=hta_compat, tokens_per_step=tokens_per_step)
    console = Console(stderr=True)
    con = open_existing_store(db)
    try:
        if memory_limit is not None:
            set_memory_limit(con, memory_limit)
        run_id, recording_id = between.resolve(con, run)
        data = {"run": None}
        if run_id is not None:
            with console.status("analyzing") as status:
                analyze_run(con, run_id, options, progress=lambda name: status.update(f"analyzing: {name}"))
            data = summary(con, run_id)
        if recording_id is not None:
            data["between_windows"] = between.view(con, recording_id)
    finally:
        con.close()
    if as_json:
        print_json(data)
    else:
        if run_id is not None:
            _print(data, top)
        if recording_id is not None:
            print_between(Console(), data["between_windows"])


def _print(data: dict, top: int) -> None:
    console = Console()
    run, m = data["run"], data["metrics"]
    console.print(f"[bold]run {run['run_id']}[/bold] {escape(run['name'])}  ranks {run['num_ranks_ingested']}/{run['world_size'] or '?'}"
                  f"  device {run['device_name'] or '?'}")
    console.print(headline(m))
    ranks = Grid("rank", "step", "compute", "exposed comm", "overlapped comm", "memcpy", "idle", "other", "comm overlap",
                  title="Where the step goes (share of the step span)")
    shown = sorted(data["ranks"], key=lambda r: -r["median_step_ns"])[:MAX_RANK_ROWS]
    for r in sorted(shown, key=lambda r: r["rank"]):
        ranks.add_row(str(r["rank"]), f"{r['median_step_ns'] / 1e6:.2f} ms",
                      *(_pct(r[k]) for k in ("compute_frac", "exposed_comm_frac", "overlapped_comm_frac",
                                             "memcpy_frac", "idle_frac", "other_frac", "comm_overlap_frac")))
    ranks.print(console)
    if len(data["ranks"]) > MAX_RANK_ROWS:
        console.print(f"({MAX_RANK_ROWS} slowest of {len(data['ranks'])} ranks shown; --json has every rank)")
    if data.get("kernel_classes"):
        console.print("kernel time by class: " + ", ".join(
            f"{escape(k['fine_class'])} {_pct(k['share_frac'])}" for k in data["kernel_classes"][:8]))
    if data.get("phases"):
        phases = Grid(*PHASE_COLUMNS, title="Phases (per step on the median rank; share of its step time)")
        for row in phase_rows(data["phases"]):
            phases.add_row(*row)
        phases.print(console)
    findings = Grid("lost/step", "severity", "finding", "advice", title="Findings, by time the step would get back")
    for f in data["findings"][:top]:
        # titles can carry kernel and op names: untrusted text, never rich markup
        findings.add_row("" if f["lost_ns"] is None else f"{f['lost_ns'] / 1e6:.2f} ms", f["severity"],
                         escape(f["title"]), escape(f["advice"] or ""))
    findings.print(console)


MAX_RANK_ROWS = 16


def headline(metrics: dict) -> str:
    """The line under the run: step time, MFU, HFU, tokens/s, each as measured or 'not measurable'."""
    heads = []
    for name, label, fmt in (("step_time_ns", "step time", lambda v: f"{v / 1e6:.2f} ms"),
                             ("mfu_frac", "MFU", _pct),
                             ("hfu_frac", "HFU", _pct),
                             ("tokens_per_s_per_device", "tokens/s/device", lambda v: f"{v:,.0f}")):
        if name in metrics:
            v = metrics[name]["value"]
            heads.append(f"{label} {fmt(v) if v is not None else 'not measurable'}")
    return "  ".join(heads)


PHASE_COLUMNS = ("phase", "mean per step", "share", "median per step", "longest mean")


def phase_rows(phases: list[dict]) -> list[tuple[str, ...]]:
    """The phase table from phases_ranks rows. Each row shows one rank, the median rank by the
    phase's mean time per step: its mean (total in the phase / its steps) beside its share of its
    step time (total in the phase / total span), which is that mean over its mean step, so the two
    columns agree and a rank's shares sum to 100%. The median over steps comes apart from both when
    a few steps are unlike the rest (a long last step, a warm-up): it is shown in its own column."""
    by_phase: dict[str, list[dict]] = {}
    for p in phases:
        by_phase.setdefault(p["phase"], []).append(p)
    out = []
    for phase, rows in by_phase.items():
        rows = sorted(rows, key=lambda p: (p["mean_ns"], p["rank"]))
        mid, longest = rows[len(rows) // 2], rows[-1]
        out.append((phase, f"{mid['mean_ns'] / 1e6:.2f} ms", _pct(mid["share_frac"]),
                    f"{mid['median_ns'] / 1e6:.2f} ms", f"{longest['mean_ns'] / 1e6:.2f} ms on rank {longest['rank']}"))
    return out
