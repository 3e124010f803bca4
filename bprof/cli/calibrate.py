"""`bprof calibrate`: measure this machine's matmul FLOP/s and copy bandwidth, and store them."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from bprof.cli.options import DbOption, JsonOption, check_store_can_be_created, print_json
from bprof.cli.tables import Grid
from bprof.replay.calibrate import calibrate as measure
from bprof.store.db import open_store
from bprof.store.peaks import save_peaks


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)


def calibrate(
    db: Path = DbOption,
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N."),
    dtype: Optional[List[str]] = typer.Option(
        None, "--dtype", help="fp32, bf16, fp16 or tf32 (cuda only); repeat for several. "
                              "Default: fp32 and bf16 on cpu; fp32, tf32, bf16 and fp16 on cuda."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="Intra-op threads (default: torch's, all cores)."),
    repeats: int = typer.Option(5, "--repeats", min=1, help="Timed repeats per dtype; the best is stored."),
    as_json: bool = JsonOption,
) -> None:
    """Measure dense matmul FLOP/s and copy bandwidth here, and store them as this host's peaks."""
    # calibrate may create the store: on a fresh machine it is the one command that comes before
    # any run (docs/calibrate.md). It creates it only once there is something to store, so a
    # calibration that fails leaves no empty store behind; a bad --db still fails before seconds
    # of measuring (an existing file that is not a store, a missing folder).
    con = open_store(db) if Path(db).exists() else None
    if con is None:
        check_store_can_be_created(db)
    try:
        with Console(stderr=True).status("calibrating") as status:
            peaks = measure(device=device, dtypes=dtype or None, num_threads=threads, repeats=repeats,
                            progress=lambda message: status.update(f"calibrating: {message}"))
        if con is None:
            con = open_store(db)
        save_peaks(con, peaks)
    finally:
        if con is not None:
            con.close()
    if as_json:
        print_json([asdict(p) for p in peaks])
        return
    first = peaks[0]
    table = Grid("dtype", "threads", "GFLOP/s", "spread", "copy GB/s", title=f"{first.host}: {first.device_name}",
                  caption=f"n={first.matmul_size}, best of {first.num_repeats} repeats; saved to {db}")
    for p in peaks:
        spread = "" if p.flops_per_s_spread_frac is None else f"{100 * p.flops_per_s_spread_frac:.1f}%"
        table.add_row(p.dtype, str(p.num_threads), f"{p.flops_per_s / 1e9:,.1f}", spread, f"{p.mem_bytes_per_s / 1e9:,.1f}")
    table.print(Console())
