"""Write a synthetic run: one Kineto trace per rank plus truth.json.

Files are written in chunks (events are serialised with orjson, a few thousand at a time);
gzip output uses mtime=0 and no file name so the same seed gives byte-identical files.
"""

from __future__ import annotations

import gzip as gzip_mod
import re
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

import orjson

from .clock import HostClock
from .kineto import RankEvents
from .program import build_programs
from .scenario import Scenario, Topology
from .timeline import simulate
from .truth import build_truth

CHUNK_EVENTS = 4096
_RANK_FILE = re.compile(r"rank\d+\.json(\.gz)?")
C10D_OP = {"c10d::allreduce_": "allreduce", "c10d::_allgather_base_": "allgather",
           "c10d::_reduce_scatter_base_": "reduce_scatter", "c10d::broadcast_": "broadcast",
           "c10d::send": "send", "c10d::recv_": "recv"}


@contextmanager
def open_output(path: Path, use_gzip: bool, level: int = 1):
    """A binary writer for `path`; gzip without a timestamp or name, for reproducible bytes."""
    with open(path, "wb", buffering=1 << 20) as raw:
        if not use_gzip:
            yield raw
            return
        with gzip_mod.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                               compresslevel=level) as gz:
            yield gz


def write_trace(f, header: dict, chunks: Iterable, footer: dict, pretty: bool = False) -> None:
    """Write `{header..., "traceEvents": [...], footer...}`; chunks are lists of event dicts
    or bytes-like objects holding comma-joined serialised events."""
    opt = orjson.OPT_INDENT_2 if pretty else 0
    f.write(b"{\n")
    for k, v in header.items():
        f.write(b'  "%s": %s,\n' % (k.encode(), orjson.dumps(v, option=opt)))
    f.write(b'  "traceEvents": [\n')
    first = True
    for chunk in chunks:
        if isinstance(chunk, list):
            data = b",\n".join([orjson.dumps(e, option=opt) for e in chunk])
        else:
            data = chunk  # any bytes-like object of pre-serialised, comma-joined events
        if not len(data):
            continue
        if not first:
            f.write(b",\n")
        f.write(data)
        first = False
    f.write(b"\n  ]")
    for k, v in footer.items():
        f.write(b',\n  "%s": %s' % (k.encode(), orjson.dumps(v, option=opt)))
    f.write(b"\n}\n")


def count_events(events: list[dict]) -> dict:
    """What truth.json promises about one file, counted from the events actually written."""
    by_cat = Counter(e["cat"] for e in events if "cat" in e)
    by_ph = Counter(e["ph"] for e in events)
    ops = Counter()
    waits = graphs = nccl = 0
    for e in events:
        cat = e.get("cat")
        if cat == "cpu_op":
            name = e["name"]
            if name in C10D_OP:
                ops[C10D_OP[name]] += 1
            elif name == "record_param_comms" and e["args"].get("Collective name") == "wait":
                waits += 1
        elif cat == "kernel" and e["name"].startswith("nccl"):
            nccl += 1
        elif cat == "cuda_runtime" and e["name"] == "cudaGraphLaunch":
            graphs += 1
    return {
        "num_events": len(events),
        "num_events_without_cat": len(events) - sum(by_cat.values()),
        "events_by_cat": dict(sorted(by_cat.items())),
        "events_by_ph": dict(sorted(by_ph.items())),
        "num_kernels": by_cat.get("kernel", 0),
        "num_nccl_kernels": nccl,
        "collectives_by_op": dict(sorted(ops.items())),
        "num_collective_calls": sum(ops.values()),
        "num_wait": waits,
        "num_p2p_send": ops.get("send", 0),
        "num_p2p_recv": ops.get("recv", 0),
        "num_cuda_graph_launches": graphs,
    }


def simulate_run(sc: Scenario, faults=None):
    """Build and time every rank's program; `faults` overrides sc.faults (counterfactuals)."""
    topo = Topology(sc)
    progs = build_programs(sc, topo, faults)
    insts = simulate(progs, sc.seed, sc.clock_jitter_ns)
    return topo, progs, insts


def host_clocks(sc: Scenario, topo: Topology) -> list[HostClock]:
    return [HostClock(sc.seed, h, topo.clock_offset_ns(h), sc.clock_jitter_ns, sc.start_ns)
            for h in range(sc.hosts)]


def write_run(sc: Scenario, out_dir, *, gzip: bool = True, pretty: bool = False) -> dict:
    """Write rank{R}.json[.gz] for every rank and truth.json into out_dir; return the truth.

    Existing rank{N}.json[.gz] files in out_dir are removed first, so the directory holds
    exactly this run.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():  # a rank file left from an earlier, larger run would be ingested
        if _RANK_FILE.fullmatch(old.name):
            old.unlink()
    topo, progs, insts = simulate_run(sc)
    clocks = host_clocks(sc, topo)
    files = []
    for prog in progs:
        rank_events = RankEvents(sc, topo, prog, clocks[topo.host(prog.rank)])
        events = rank_events.events()
        name = f"rank{prog.rank}.json" + (".gz" if gzip else "")
        with open_output(out / name, gzip) as f:
            write_trace(f, rank_events.header(topo),
                        (events[i:i + CHUNK_EVENTS] for i in range(0, len(events), CHUNK_EVENTS)),
                        rank_events.footer(name), pretty)
        files.append({"file": name, "counts": count_events(events),
                      "base_time_ns": rank_events.base_ns})
        del events
    truth = build_truth(sc, topo, progs, insts, files, clocks)
    data = orjson.dumps(truth, option=orjson.OPT_INDENT_2)
    (out / "truth.json").write_bytes(data + b"\n")
    return orjson.loads(data)
