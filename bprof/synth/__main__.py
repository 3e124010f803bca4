"""`python -m bprof.synth OUT_DIR [...]`: write a synthetic multi-rank run and its truth.json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .scenario import FAULT_DOCS, FORMATS, Fault, Scenario
from .writer import write_run


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bprof.synth", description=__doc__,
                                epilog="Faults: " + "; ".join(f"{k}: {v}" for k, v in FAULT_DOCS.items()))
    p.add_argument("out_dir", type=Path)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--hosts", type=int, default=1)
    p.add_argument("--format", choices=FORMATS, default="modern")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clock-offset-us", type=int, default=0, help="host h's clock runs h x this ahead")
    p.add_argument("--slow-rank", type=int, default=None, help="plant a slow rank (see Faults)")
    p.add_argument("--slow-ms", type=float, default=5.0, help="extra compute per step on the slow rank")
    args = p.parse_args(argv)
    faults = []
    if args.slow_rank is not None:
        faults.append(Fault("slow_rank", rank=args.slow_rank, extra_ns=int(args.slow_ms * 1e6)))
    offsets = {h: h * args.clock_offset_us * 1000 for h in range(args.hosts)}
    truth = write_run(Scenario(tp=args.tp, pp=args.pp, dp=args.dp, steps=args.steps, hosts=args.hosts,
                               fmt=args.format, seed=args.seed, clock_offset_ns=offsets, faults=tuple(faults)),
                      args.out_dir)
    events = sum(r["counts"]["num_events"] for r in truth["ranks"])
    print(f"wrote {truth['world_size']} rank traces ({events:,} events) and truth.json to {args.out_dir}")
    for fault in truth["faults"]:
        print("planted", json.dumps({k: fault[k] for k in ("kind", "rank", "host", "extra_ns", "factor")}))


if __name__ == "__main__":
    main()
