"""Format one simulated rank as Kineto trace events, in the "modern" or the "2022" dialect.

modern (torch >= 2.4, kineto with CUDA 12): ts/dur are float µs with exactly 3 decimals relative
to baseTimeNanoseconds; flows `ac2g` (+ `fwdbwd`); runtime/kernel `External id` = the launching
CPU op's External id; record_param_comms carries the collective args and kineto copies them onto
the NCCL kernel; Work.wait() is a record_param_comms "wait"; CUDA-graph kernels share the
cudaGraphLaunch correlation id.
2022 (torch 1.12/1.13): ts absolute epoch µs and dur as integers; flows `async_cpu_to_gpu`/
`async_gpu`; args carry `Trace name`, `Profiler Event Index`, `Module Hierarchy`, `Call stack`;
runtime/kernel `External id` equals their correlation id (CPU linkage is by time nesting only);
record_param_comms has no collective args.
Event order in the file follows real traces: CPU ops per thread, runtime calls, GPU activities
per stream, metadata rows, then the profiler span and instant markers.
"""

from __future__ import annotations

from functools import lru_cache
from math import prod

import orjson

from .catalog import DEVICE_PROPS, INPUT_TYPE, LAUNCH
from .ops import BWD, MAIN

TRIMONTH_S = 7_889_238
C10D_SHAPES = {  # (Input type of each argument) for the c10d ops, after the tensor argument
    "allreduce": ["", "", "", "Scalar", "Scalar"],
    "broadcast": ["", "Scalar", "Scalar", "Scalar", "Scalar"],
    "send": ["", "Scalar", "Scalar"],
    "recv": ["", "Scalar", "Scalar"],
}
WAIT_ARGS = ("Collective name", "dtype", "Out split size", "In msg nelems", "Group size",
             "Process Group Ranks")


def base_time_ns(written_start_ns: int) -> int:
    """kineto's ChromeTraceBaseTime: the epoch floored to 7,889,238-second periods."""
    return written_start_ns // 1_000_000_000 // TRIMONTH_S * TRIMONTH_S * 1_000_000_000


@lru_cache(maxsize=None)
def ranks_str(ranks: tuple) -> str:
    """`Process Group Ranks` as torch writes it: "[0, 1]"."""
    return "[" + ", ".join(str(r) for r in ranks) + "]"


class RankEvents:
    """All events of one rank. `clock` maps true ns to written epoch ns (clock.HostClock)."""

    def __init__(self, sc, topo, prog, clock, id_bases=None):
        self.sc, self.prog, self.clock = sc, prog, clock
        # First External id, correlation id, fwdbwd flow id and Ev Idx (large.py fixes widths).
        self.id_bases = id_bases or (1, (1_000 if sc.fmt == "modern" else 1_000_000)
                                     + prog.rank * 7, 1, 0)
        self.modern = sc.fmt == "modern"
        self.rank = prog.rank
        self.device = topo.local_rank(prog.rank)
        self.host_name = topo.host_name(topo.host(prog.rank))
        self.local_gpus = topo.ranks_per_host
        self.props = DEVICE_PROPS[sc.device]
        self.pid = prog.pid
        self.tids = prog.tids
        self.t_begin = prog.start_ns - prog.lead_ns
        self.t_end = self._last_true_ns() + prog.tail_ns
        self.base_ns = base_time_ns(clock.written(self.t_begin)) if self.modern else None

    # --- time ---------------------------------------------------------------------------------

    def ts(self, t):
        w = self.clock.written(t)
        if not self.modern:
            return w // 1000
        return orjson.Fragment(b"%d.%03d" % divmod(w - self.base_ns, 1000))

    def dur(self, t0, t1):
        w0, w1 = self.clock.written(t0), self.clock.written(t1)
        if not self.modern:
            return w1 // 1000 - w0 // 1000
        return orjson.Fragment(b"%d.%03d" % divmod(w1 - w0, 1000))

    def _last_true_ns(self) -> int:
        last = 0
        for op in self.prog.ops:
            for c in op.cpu:
                last = max(last, op.t0 + c.rel + c.dur + (op.block if c.stretch else 0))
            for rt in op.rts:
                for g in rt.gpus:
                    last = max(last, g.end)
        return last

    # --- ids ----------------------------------------------------------------------------------

    def _assign_ids(self) -> None:
        ext, corr, flow, _ = self.id_bases
        self.flow_of_seq = {}
        for op in self.prog.ops:
            for c in op.cpu:
                c.ext = ext
                ext += 1
                if self.modern and c.info and c.info.get("flow_end") and c.info.get("seq"):
                    self.flow_of_seq[c.info["seq"]] = flow
                    flow += 1
            for rt in op.rts:
                rt.corr = corr
                corr += 1

    # --- events -------------------------------------------------------------------------------

    def events(self) -> list[dict]:
        self._assign_ids()
        out: list[dict] = []
        ev_idx = self.id_bases[3]
        for thread in (MAIN, BWD):
            tid = self.tids[thread]
            if self.modern:  # modern `Ev Idx` counts per thread; 2022's index is per file
                ev_idx = self.id_bases[3]
            for op in self.prog.ops:
                if op.thread != thread:
                    continue
                for c in op.cpu:
                    t0 = op.t0 + c.rel
                    t1 = t0 + c.dur + (op.block if c.stretch else 0)
                    out.append({"ph": "X", "cat": c.cat, "name": c.name, "pid": self.pid,
                                "tid": tid, "ts": self.ts(t0), "dur": self.dur(t0, t1),
                                "args": self._cpu_args(c, ev_idx)})
                    ev_idx += 1
                    info = c.info
                    if info and self.modern and info.get("seq") in self.flow_of_seq:
                        if info.get("flow_end"):
                            out.append(self._flow("f", self.flow_of_seq[info["seq"]], self.pid,
                                                  tid, t0, "fwdbwd"))
                        elif not info.get("bwd"):
                            out.append(self._flow("s", self.flow_of_seq[info["seq"]], self.pid,
                                                  tid, t0, "fwdbwd"))
        gpus = []
        for op in self.prog.ops:
            tid = self.tids[op.thread]
            for rt in op.rts:
                t0 = op.t0 + rt.rel
                t1 = t0 + rt.dur + (op.block if rt.stretch else 0)
                args = {"External id": self._rt_ext(op, rt), "cbid": rt.cbid,
                        "correlation": rt.corr}
                if args["External id"] is None:
                    del args["External id"]
                out.append({"ph": "X", "cat": "cuda_runtime", "name": rt.name, "pid": self.pid,
                            "tid": tid, "ts": self.ts(t0), "dur": self.dur(t0, t1), "args": args})
                if rt.gpus:
                    out.append(self._flow("s", rt.corr, self.pid, tid, t0, "ac2g"))
                    ext = self._rt_ext(op, rt) or rt.corr
                    gpus.extend((g.stream, g.start, i, g, rt.corr, ext)
                                for i, g in enumerate(rt.gpus))
        gpus.sort(key=lambda x: (x[0], x[1], x[2]))
        for stream, start, _, g, corr, ext in gpus:
            out.append({"ph": "X", "cat": g.cat, "name": g.name, "pid": self.device,
                        "tid": stream, "ts": self.ts(start), "dur": self.dur(start, g.end),
                        "args": self._gpu_args(g, corr, ext)})
            out.append(self._flow("f", corr, self.device, stream, start, "ac2g"))
        out.extend(self._metadata({g.stream for _, _, _, g, _, _ in gpus}))
        return out

    def _rt_ext(self, op, rt):
        if not self.modern:
            return rt.corr  # 2022 quirk: runtime/GPU External id is the correlation id
        return op.cpu[rt.owner].ext if rt.owner >= 0 else None

    def _flow(self, ph, fid, pid, tid, t, cat):
        if not self.modern:
            return {"ph": ph, "id": fid, "pid": pid, "tid": tid, "ts": self.ts(t),
                    "cat": "async_cpu_to_gpu", "name": "async_gpu", "bp": "e"}
        ev = {"ph": ph, "id": fid, "pid": pid, "tid": tid, "ts": self.ts(t), "cat": cat,
              "name": cat}
        if ph == "f":
            ev["bp"] = "e"
        return ev

    # --- args ---------------------------------------------------------------------------------

    def _cpu_args(self, c, ev_idx) -> dict:
        info = c.info or {}
        kind = info.get("kind")
        if self.modern:
            a = {"External id": c.ext, "Record function id": c.ext}
        else:
            a = {"Trace name": "PyTorch Profiler", "Trace iteration": 0, "External id": c.ext,
                 "Profiler Event Index": ev_idx}
        if kind == "wait":
            return self._wait_args(a, ev_idx) if self.modern else self._tail_2022(a)
        if kind == "rpc":
            return self._rpc_args(a, info["comm"], ev_idx) if self.modern else self._tail_2022(a)
        sh = info.get("shapes")
        if kind == "c10d":
            sh = self._c10d_shapes(info["comm"])
        elif kind == "annot" and not self.modern:
            cm = info["comm"]
            sh = ([[cm.in_nelems]], [INPUT_TYPE[cm.dtype]], None, None)
        if self.modern:
            if info.get("seq") is not None:
                a["Sequence number"] = info["seq"]
                a["Fwd thread id"] = 1 if info.get("bwd") else 0
            if sh:
                a["Concrete Inputs"], a["Input type"] = sh[3], sh[1]
                a["Input Strides"], a["Input Dims"] = sh[2], sh[0]
            a["Ev Idx"] = ev_idx
            return a
        if sh:
            a["Input Dims"], a["Input type"] = sh[0], sh[1]
        if info.get("seq") is not None:
            a["Fwd thread id"] = 1 if info.get("bwd") else 0
            a["Sequence number"] = info["seq"]
        return self._tail_2022(a)

    @staticmethod
    def _tail_2022(a):
        a["Module Hierarchy"] = ""
        a["Call stack"] = ""
        return a

    def _c10d_shapes(self, cm):
        return _c10d_shapes(self.modern, cm.op, cm.in_nelems, cm.out_nelems, cm.dtype)

    def _rpc_args(self, a, cm, ev_idx) -> dict:
        g = cm.group
        # Key order as in a real torch 2.3 NCCL trace (an unordered_map), plus Rank and Seq.
        a.update({"Process Group Name": g.name, "Global rank stride": g.stride,
                  "Out msg nelems": cm.out_nelems, "Process Group Ranks": ranks_str(g.ranks),
                  "Group size": len(g.ranks), "Global rank start": g.ranks[0], "Ev Idx": ev_idx,
                  "In msg nelems": cm.in_nelems, "In split size": "[]", "Out split size": "[]",
                  "dtype": cm.dtype, "Process Group Description": g.desc,
                  "Collective name": cm.op, "Rank": self.rank, "Seq": cm.seq})
        return a

    @staticmethod
    def _wait_args(a, ev_idx) -> dict:
        ext = a["External id"]
        return {"External id": ext, "Collective name": "wait", "dtype": "Byte",
                "Out split size": "[]", "In msg nelems": 0, "Group size": 1,
                "Process Group Ranks": "[]", "Record function id": ext, "Out msg nelems": 0,
                "In split size": "[]", "Ev Idx": ev_idx}

    def _gpu_args(self, g, corr, ext) -> dict:
        dur = max(1, g.end - g.start)
        if g.cat != "kernel":
            return {"External id": ext, "device": self.device, "context": 1,
                    "stream": g.stream, "correlation": corr, "bytes": g.nbytes,
                    "memory bandwidth (GB/s)": g.nbytes / dur}
        grid, block, regs, smem = LAUNCH[g.shape]
        sms = self.props["numSms"]
        blocks = prod(grid)
        warps = blocks * -(-prod(block) // 32)
        a = {"External id": ext, "queued": 0, "device": self.device, "context": 1,
             "stream": g.stream, "correlation": corr, "registers per thread": regs,
             "shared memory": smem, "blocks per SM": round(blocks / sms, 6),
             "warps per SM": round(warps / sms, 6),
             "grid": grid, "block": block,
             "est. achieved occupancy %": min(100, round(100 * warps / sms / 64))}
        if self.modern:
            a["graph id"], a["graph node id"] = g.graph if g.graph else (0, 0)
            cm = g.comm
            if cm is not None:  # kineto copies these from the linked record_param_comms
                grp = cm.group
                a.update({"Collective name": cm.op, "In msg nelems": cm.in_nelems,
                          "Out msg nelems": cm.out_nelems, "Group size": len(grp.ranks),
                          "dtype": cm.dtype, "In split size": "[]", "Out split size": "[]",
                          "Process Group Name": grp.name,
                          "Process Group Description": grp.desc,
                          "Process Group Ranks": ranks_str(grp.ranks), "Seq": cm.seq})
        return a

    # --- metadata rows and markers ------------------------------------------------------------

    def _metadata(self, streams) -> list[dict]:
        t = self.ts(self.t_begin + 30_000)
        pid = self.pid
        out = [_m("process_name", t, pid, 0, "name", "python3.10"),
               _m("process_labels", t, pid, 0, "labels", "CPU"),
               _m("process_sort_index", t, pid, 0, "sort_index", pid)]
        for d in range(self.local_gpus):
            out += [_m("process_name", t, d, 0, "name", "python3.10"),
                    _m("process_labels", t, d, 0, "labels", f"GPU {d}"),
                    _m("process_sort_index", t, d, 0, "sort_index", 16777216 + d)]
        for s in sorted(streams):
            out += [_m("thread_name", t, self.device, s, "name", f"stream {s} "),
                    _m("thread_sort_index", t, self.device, s, "sort_index", s)]
        for tid, label in ((self.tids[MAIN], "pt_main_thread"),
                           (self.tids[BWD], "pt_autograd_0")):
            out += [_m("thread_name", t, pid, tid, "name", f"thread {tid} ({label})"),
                    _m("thread_sort_index", t, pid, tid, "sort_index", tid)]
        t0 = self.ts(self.t_begin)
        out.append({"ph": "X", "cat": "Trace", "ts": t0, "dur": self.dur(self.t_begin, self.t_end),
                    "pid": "Spans", "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)",
                    "args": {"Op count": 0}})
        out.append(_m("process_sort_index", t0, "Spans", 0, "sort_index", 536870912))
        out.append({"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",
                    "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": t0})
        out.append({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
                    "ts": self.ts(self.t_end)})
        return out

    def header(self, topo) -> dict:
        """Top-level keys that precede traceEvents.

        `host_name` is not Kineto's: real traces do not name their host. It stands in for the host
        `bprof record` stores beside each trace, so ingest can group ranks by host."""
        devs = [dict({"id": d}, **self.props) for d in range(self.local_gpus)]
        if not self.modern:
            return {"schemaVersion": 1, "deviceProperties": devs,
                    "distributedInfo": {"backend": "nccl", "rank": self.rank,
                                        "world_size": topo.world},
                    "host_name": self.host_name}
        pgs = [{"pg_name": g.name, "pg_desc": g.desc, "backend_config": "cuda:nccl",
                "pg_size": len(g.ranks), "ranks": list(g.ranks)} for g in topo.groups_of(self.rank)]
        return {"schemaVersion": 1, "deviceProperties": devs,
                "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": topo.world,
                                    "pg_count": len(pgs), "pg_config": pgs,
                                    "nccl_version": "2.21.5"},
                "host_name": self.host_name}

    def footer(self, trace_name: str) -> dict:
        """Top-level keys that follow traceEvents (baseTimeNanoseconds last, as in real files)."""
        if not self.modern:
            return {}
        return {"traceName": trace_name, "displayTimeUnit": "ms",
                "baseTimeNanoseconds": self.base_ns}


@lru_cache(maxsize=1024)
def _c10d_shapes(modern, op, in_nelems, out_nelems, dtype):
    """record_shapes args of a c10d op (the tensor list, then group/op/flags/timeout)."""
    t = INPUT_TYPE[dtype]
    if op in ("allgather", "reduce_scatter"):
        dims = [[out_nelems], [in_nelems], [], [], []]
        types = [t, t, "", "Scalar", "Scalar"]
        if not modern:
            return dims, types, None, None
        return dims, types, [[1], [1], [], [], []], ["", "", "", "False", "-1"]
    if not modern:  # 2022 records TensorList dims as []
        return [[], [], [], []], ["TensorList", "", "Scalar", "Scalar"], None, None
    rest = C10D_SHAPES[op]
    dims = [[[in_nelems]]] + [[] for _ in rest]
    strides = [[[1]]] + [[] for _ in rest]
    concrete = [""] + ["" if r != "Scalar" else "-1" for r in rest]
    return dims, ["TensorList"] + rest, strides, concrete


def _m(name, ts, pid, tid, key, value) -> dict:
    return {"name": name, "ph": "M", "ts": ts, "pid": pid, "tid": tid, "args": {key: value}}

