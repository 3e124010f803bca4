"""Stream one very large single-rank Kineto trace to disk in constant memory.

One training step of rank 0 of a small TP2 x PP2 x DP2 run is simulated and serialised once (the
template). Every number that must change from step to step (ts, External id, Record function id,
correlation, flow id, Ev Idx, Sequence number, Seq, the N of ProfilerStep#N) is given a fixed
digit width, so each further step is the same bytes with those digits rewritten in place by
numpy: no per-event Python work after the template, hence disk-bound write speed.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import orjson

from .clock import HostClock
from .kineto import RankEvents
from .scenario import Scenario
from .writer import open_output, simulate_run, write_trace

# Fixed digit widths: each range stays inside one power of ten for any practical file size.
FIRST_STEP = 1_000_000            # ProfilerStep#1000000, 7 digits
EXT_BASE = 1_000_000_000          # External ids (and fwdbwd flow ids, Ev Idx): 10 digits
CORR_BASE = 3_000_000_000         # correlation ids (and ac2g flow ids): 10 digits, disjoint
SEQ_BASE = 1_000_000_000          # autograd Sequence number and collective Seq: 10 digits
# Relative ts of the modern format start at 1.2e12 µs (about 14 days after the kineto base),
# so the integer part keeps 10 digits for the whole file.
TRIMONTH_NS = 7_889_238 * 1_000_000_000
START_NS = 227 * TRIMONTH_NS + 1_200_000_000_000_000

# (key bytes, kind) of the numbers rewritten per step.
_FIELDS = ((b'"ts":', "ts"), (b'"External id":', "id"), (b'"Record function id":', "id"),
           (b'"correlation":', "id"), (b',"id":', "id"), (b'"Ev Idx":', "ev"),
           (b'"Profiler Event Index":', "ev"), (b'"Sequence number":', "autograd"),
           (b'"Seq":', "seq"), (b'ProfilerStep#', "step"))


def write_large_trace(path, target_bytes: int, fmt: str = "modern", seed: int = 0) -> dict:
    """Write about `target_bytes` of one rank's trace to `path` (.gz: gzip level 1).

    Returns what was written: json_bytes (uncompressed), events, steps, seconds and mb_per_s
    (uncompressed MB per second, the template simulation included).
    """
    t0 = time.perf_counter()
    path = Path(path)
    layers = 8 if target_bytes >= 64 << 20 else 2
    sc = Scenario(tp=2, pp=2, dp=2, steps=1, first_step=FIRST_STEP, layers=layers,
                  microbatches=4, hosts=1, fmt=fmt, seed=seed, start_ns=START_NS)
    topo, progs, _ = simulate_run(sc)
    prog = progs[0]
    _renumber(prog)
    clock = HostClock(seed, 0, 0, 0, START_NS)
    rank = RankEvents(sc, topo, prog, clock, id_bases=(EXT_BASE, CORR_BASE, EXT_BASE, EXT_BASE))
    events = rank.events()
    body = [e for e in events if e["ph"] not in ("M", "i") and e.get("cat") != "Trace"]
    tail = [e for e in events if e["ph"] in ("M", "i") or e.get("cat") == "Trace"]
    period_ns = -(-(rank.t_end - prog.start_ns + 50_000) // 1000) * 1000
    patch = _Template(body, fmt, period_ns, prog)

    header = rank.header(topo)
    footer = rank.footer(path.name)
    budget = target_bytes - len(orjson.dumps(header)) - 400 * len(tail)
    written = {"bytes": 0, "blocks": 0}

    def chunks():
        while written["blocks"] == 0 or written["bytes"] + patch.size // 2 < budget:
            yield patch.block(written["blocks"])
            written["bytes"] += patch.size + 2
            written["blocks"] += 1
        yield _final_tail(rank, tail, period_ns * written["blocks"])

    with open_output(path, path.suffix == ".gz") as f:
        counted = _Counting(f)
        write_trace(counted, header, chunks(), footer)
    seconds = time.perf_counter() - t0
    return {"path": str(path), "fmt": fmt, "json_bytes": counted.n,
            "events": written["blocks"] * len(body) + len(tail), "steps": written["blocks"],
            "seconds": seconds, "mb_per_s": counted.n / 1e6 / seconds}


class _Counting:
    """Counts the (uncompressed) JSON bytes written."""

    def __init__(self, f):
        self.f, self.n = f, 0

    def write(self, data):
        self.n += len(data)
        return self.f.write(data)


def _renumber(prog) -> None:
    """Move autograd sequence numbers and collective Seq to fixed-width ranges."""
    infos = [c.info for op in prog.ops for c in op.cpu if c.info and c.info.get("seq")]
    low = min((i["seq"] for i in infos), default=0)
    for i in infos:
        i["seq"] = SEQ_BASE + i["seq"] - low
    for p2p in (False, True):
        comms = [c for c in prog.comms if (c.peer is not None) == p2p]
        groups = {c.group.index if not p2p else -1 for c in comms}
        for g in groups:
            mine = [c for c in comms if p2p or c.group.index == g]
            low = min(c.seq for c in mine)
            for c in mine:
                c.seq = SEQ_BASE + c.seq - low


def _final_tail(rank, tail, span_ns) -> list[dict]:
    """Metadata rows and markers, with the profiler span stretched over every step."""
    out = []
    for e in tail:
        e = dict(e)
        if e.get("cat") == "Trace":
            e["dur"] = rank.dur(rank.t_begin, rank.t_end + span_ns)
        elif e["name"] == "Record Window End":
            e["ts"] = rank.ts(rank.t_end + span_ns)
        out.append(e)
    return out


class _Template:
    """The serialised body of one step plus where each per-step number sits in it."""

    def __init__(self, body, fmt, period_ns, prog):
        parts = [orjson.dumps(e) for e in body]
        self.buf = np.frombuffer(b",\n".join(parts), dtype=np.uint8).copy()
        calls = {}
        for c in prog.comms:
            k = "p2p" if c.peer is not None else c.group.name
            calls[k] = calls.get(k, 0) + 1
        n_auto = sum(1 for op in prog.ops for c in op.cpu if c.info and c.info.get("seq"))
        id_span = max(len(body), 1) * 2
        shift = {"ts": period_ns if fmt == "modern" else period_ns // 1000, "id": id_span,
                 "ev": len(body), "autograd": n_auto + 1, "step": 1}
        fields: dict[tuple[int, int], list] = {}  # (digits, dot position or -1) -> rows
        offset = 0
        for part, e in zip(parts, body):
            for key, kind in _FIELDS:
                at = part.find(key)
                if at < 0:
                    continue
                start = at + len(key)
                end = start
                while end < len(part) and (48 <= part[end] <= 57 or part[end] == 46):
                    end += 1
                text = part[start:end].decode()
                dot = text.find(".")
                value = int(text.replace(".", ""))
                if kind == "seq":
                    args = e["args"]
                    p2p = args.get("Collective name") in ("send", "recv")
                    step = calls["p2p" if p2p else args["Process Group Name"]]
                else:
                    step = shift[kind]
                fields.setdefault((len(text) - (dot >= 0), dot), []).append(
                    (offset + start, value, step))
            offset += len(part) + 2
        # Digits are produced four at a time; the leading pad digits of each number go to one
        # scratch byte past the end, so every scatter has a contiguous source and a flat index.
        self.size = len(self.buf)
        self.buf = np.append(self.buf, np.uint8(0))
        self.groups = []
        for (digits, dot), rows in fields.items():
            arr = np.array(rows, dtype=np.int64)
            cols = np.arange(digits)
            if dot >= 0:
                cols = np.where(cols >= dot, cols + 1, cols)
            pad = -digits % 4
            index = np.full((len(arr), pad + digits), self.size, dtype=np.int64)
            index[:, pad:] = arr[:, 0][:, None] + cols[None, :]
            self.groups.append((index.ravel(), arr[:, 1], arr[:, 2], digits))

    def block(self, k: int):
        """The buffer rewritten for the k-th step (in place; valid until the next call)."""
        for index, base, step, digits in self.groups:
            values = base + k * step
            if values.max() >= 10 ** digits:
                raise OverflowError("large trace exceeded its fixed digit widths")
            self.buf[index] = _ascii_digits(values, digits)
        return self.buf[:self.size]


# ASCII of 0000..9999, four bytes per entry, read as one uint32 each.
_LUT4 = np.frombuffer("".join(f"{i:04d}" for i in range(10_000)).encode(),
                      dtype=np.uint32)


def _ascii_digits(values: np.ndarray, digits: int) -> np.ndarray:
    """Flat uint8 ASCII of non-negative values, each zero-padded to a multiple of four digits
    (one table lookup per four digits; numpy's int64 `%` per digit was ten times slower)."""
    chunks = -(-digits // 4)
    out = np.empty((len(values), chunks), dtype=np.uint32)
    v = values
    for j in range(chunks - 1, -1, -1):
        q = v // 10_000
        out[:, j] = _LUT4[v - q * 10_000]
        v = q
    return out.view(np.uint8).ravel()
