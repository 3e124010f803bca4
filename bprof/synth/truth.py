"""The planted truth of a synthetic run, as written to truth.json.

All `*_ns` times are true times on the global clock (epoch ns, before any host offset or wander);
a rank writes `true + clock_offset_ns(host) + wander` with |wander| <= clock_jitter_ns.
Fault effects are measured, not guessed: each fault's run is re-simulated without that fault
(same seed, same random draws) and the per-rank differences are reported.
"""

from __future__ import annotations

from dataclasses import asdict

from .catalog import DEVICE_PROPS, ELEM_BYTES
from .ops import COMPUTE_STREAM
from .scenario import FAULT_DOCS
from .schedule import bubble_frac

TRUTH_VERSION = 1


def scenario_dict(sc) -> dict:
    d = asdict(sc)
    d["faults"] = [asdict(f) for f in sc.faults]
    d["clock_offset_ns"] = {str(k): v for k, v in sorted(sc.clock_offset_ns.items())}
    d["world_size"] = sc.world_size
    d["num_layers"] = sc.num_layers
    d["compute_dtype"] = sc.compute_dtype
    return d


def step_stats(progs, insts) -> list[dict]:
    """Per rank, per step: true start/duration, NCCL wait for the last peer, compute kernel time,
    executed matmul/attention FLOPs and the time of the kernels that execute them."""
    stats = []
    for p in progs:
        n = len(p.step_ops)
        compute, flops, matmul = [0] * n, [0] * n, [0] * n
        for op in p.ops:
            for rt in op.rts:
                for g in rt.gpus:
                    if g.cat == "kernel" and g.stream == COMPUTE_STREAM:
                        compute[g.step] += g.end - g.start
                        if g.flops:
                            flops[g.step] += g.flops
                            matmul[g.step] += g.end - g.start
        stats.append({"ts": [op.t0 for op in p.step_ops],
                      "dur": [op.cpu[0].dur for op in p.step_ops],
                      "wait": [0] * n, "compute": compute, "flops": flops, "matmul": matmul})
    for inst in insts.values():
        for rank, g in inst.arrivals:
            stats[rank]["wait"][g.comm.step] += inst.last_arrival - g.start
    return stats


def _mean(xs) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _ordered(insts) -> list:
    """Instances in truth.json `collectives` order."""
    return sorted(insts.values(), key=lambda i: (i.last_arrival, i.key))


def collectives(insts) -> list[dict]:
    out = []
    for inst in _ordered(insts):
        c = inst.comm
        p2p = c.peer is not None
        members = sorted(inst.arrivals)
        d = {"op": "p2p" if p2p else c.op, "pg_name": c.group.name, "pg_desc": c.group.desc,
             "seq": None if p2p else c.seq, "step": c.step, "dtype": c.dtype,
             "in_nelems": c.in_nelems, "out_nelems": c.out_nelems,
             "bytes": c.in_nelems * ELEM_BYTES[c.dtype], "ranks": list(c.members),
             "transfer_ns": c.transfer, "last_arrival_ns": inst.last_arrival,
             "last_rank": inst.last_rank,
             "members": [{"rank": r, "seq": g.comm.seq, "op": g.comm.op,
                          "arrival_ns": g.start, "end_ns": g.end} for r, g in members]}
        if p2p:
            d["src"], d["dst"] = c.members
            d["pair_index"] = c.key[3]
        out.append(d)
    return out


def _ranks_of(topo, fault) -> list[int]:
    sc = topo.sc
    if fault.kind == "slow_rank":
        return [fault.rank]
    if fault.kind == "slow_host":
        return [r for r in range(topo.world) if topo.host(r) == fault.host]
    if fault.kind == "stalled_input":
        return list(range(topo.world)) if fault.rank is None else [fault.rank]
    if fault.kind == "stage_imbalance":
        return [r for r in range(topo.world) if topo.coords(r)[0] == sc.pp - 1]
    return [r for r in range(topo.world) if sc.dp > 1]


def _slow_link(sc, topo, f, insts, cf_insts) -> tuple[list[int], dict]:
    """The instances a slow_link fault slows, compared with the same instances without it."""
    order = _ordered(insts)
    hit = [(i, inst) for i, inst in enumerate(order)
           if topo.link_factor((f,), inst.comm.members) != 1.0]
    ranks = sorted({r for _, inst in hit for r in inst.comm.members})
    extra = [inst.comm.transfer - cf_insts[inst.key].comm.transfer for _, inst in hit]
    factors = [inst.comm.transfer / cf_insts[inst.key].comm.transfer for _, inst in hit]
    return ranks, {
        "host": topo.host_name(f.host), "factor": f.factor,
        "host_ranks": [r for r in range(topo.world) if topo.host(r) == f.host],
        "collective_indices": [i for i, _ in hit],
        "num_instances": len(hit),
        "pg_names": sorted({inst.comm.group.name for _, inst in hit}, key=int),
        "transfer_factor_mean": _mean(factors),
        "extra_transfer_ns_per_step": sum(extra) / sc.steps,
    }


def fault_effects(sc, topo, base_stats, insts) -> list[dict]:
    from .writer import simulate_run  # the counterfactual runs reuse the whole pipeline

    out = []
    for i, f in enumerate(sc.faults):
        others = sc.faults[:i] + sc.faults[i + 1:]
        _, cf_progs, cf_insts = simulate_run(sc, others)
        cf = step_stats(cf_progs, cf_insts)
        delta = {k: [_mean(b[k]) - _mean(c[k]) for b, c in zip(base_stats, cf)]
                 for k in ("dur", "wait", "compute")}
        if f.kind == "slow_link":
            ranks, link = _slow_link(sc, topo, f, insts, cf_insts)
        else:
            ranks = _ranks_of(topo, f)
        peers = [r for r in range(topo.world) if r not in ranks]
        d = dict(asdict(f), plants=FAULT_DOCS[f.kind], ranks=ranks,
                 counterfactual={"step_dur_delta_ns": delta["dur"],
                                 "nccl_wait_delta_ns_per_step": delta["wait"],
                                 "compute_kernel_delta_ns_per_step": delta["compute"]})
        expected = {"ranks": ranks}
        if f.kind == "slow_rank":
            expected.update(slow_rank=f.rank, extra_compute_ns_per_step=f.extra_ns,
                            peer_wait_ns_per_step=_mean([delta["wait"][r] for r in peers]),
                            slow_rank_wait_ns_per_step=delta["wait"][f.rank])
        elif f.kind == "slow_host":
            expected.update(host=topo.host_name(f.host), factor=f.factor)
        elif f.kind == "stalled_input":
            expected.update(extra_ns_per_step=f.extra_ns)
        elif f.kind == "stage_imbalance":
            expected.update(stage=sc.pp - 1, factor=f.factor)
        elif f.kind == "exposed_comm":
            expected.update(exposed_ns_per_step=_mean([delta["dur"][r] for r in ranks]))
        elif f.kind == "slow_link":
            expected.update(link)
        d["expected"] = expected
        out.append(d)
    return out


def build_truth(sc, topo, progs, insts, files, clocks) -> dict:
    stats = step_stats(progs, insts)
    ranks = []
    for p, f, st in zip(progs, files, stats):
        r = p.rank
        stage, dpi, tpi = topo.coords(r)
        host = topo.host(r)
        ranks.append({
            "rank": r, "local_rank": topo.local_rank(r), "host": topo.host_name(host),
            "host_index": host, "file": f["file"], "pid": p.pid,
            "tids": {"main": p.tids[0], "autograd": p.tids[1]},
            "device_index": topo.local_rank(r), "device": DEVICE_PROPS[sc.device]["name"],
            "pp_stage": stage, "dp_index": dpi, "tp_index": tpi,
            "clock_offset_ns": topo.clock_offset_ns(host),
            "base_time_ns": f["base_time_ns"],
            "counts": f["counts"],
            "steps": [sc.first_step + i for i in range(sc.steps)],
            "step_ts_ns": st["ts"], "step_dur_ns": st["dur"],
            "step_nccl_wait_ns": st["wait"], "step_compute_kernel_ns": st["compute"],
            "step_executed_flops": st["flops"], "step_matmul_kernel_ns": st["matmul"],
        })
    return {
        "truth_version": TRUTH_VERSION,
        "format": sc.fmt,
        "world_size": topo.world,
        "ranks_per_host": topo.ranks_per_host,
        "scenario": scenario_dict(sc),
        "clock_model": "written_ns = true_ns + clock_offset_ns[host] + wander(true_ns), "
                       "|wander| <= clock_jitter_ns, t + wander(t) non-decreasing",
        "hosts": [{"host": topo.host_name(h), "index": h, "clock_offset_ns": c.offset_ns,
                   "clock_jitter_ns": c.jitter_ns,
                   "ranks": [r for r in range(topo.world) if topo.host(r) == h]}
                  for h, c in enumerate(clocks)],
        "process_groups": [{"pg_name": g.name, "pg_desc": g.desc, "ranks": list(g.ranks)}
                           for g in topo.groups],
        "pipeline": {"schedule": sc.schedule, "stages": sc.pp, "microbatches": sc.microbatches,
                     "bubble_frac_theory": bubble_frac(sc.schedule, sc.pp, sc.microbatches),
                     "layers_per_stage": [topo.stage_layers(s) for s in range(sc.pp)]},
        "ranks": ranks,
        "collectives": collectives(insts),
        "faults": fault_effects(sc, topo, stats, insts),
    }
