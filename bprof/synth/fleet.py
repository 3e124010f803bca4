"""A fleet-sized run written straight into a store: what cross-rank analysis reads at 10,000 ranks.

Kineto files of 10,240 ranks would be terabytes; cross-rank analysis reads only the compact
per-rank tables `bprof reduce` ships from each rank (`ranks`, `steps`, `collectives`,
`clock_samples`, and its spans, per-step partition, communication per parallel dimension and
exposed-communication intervals, which ingest puts in the reduced_* tables). This module simulates a Megatron-style TP x PP x DP job at
the level of those tables and inserts them as a run of reduced ranks, with the truth to check the
analysis against; `bprof analyze` runs on it as on any reduced run.

Model (true time, ns). Rank r = p*(TP*DP) + d*TP + t (stage p, data-parallel index d, tensor index
t); each host holds `gpus_per_host` consecutive ranks. A step runs the 1F1B schedule of
`microbatches` micro-batches on every stage. A forward chunk is `tp_per_forward` TP all-reduces
with work before each (the chunk's compute split evenly, noisy per rank); a backward chunk
`tp_per_backward`. An all-reduce ends `tp_transfer_ns` after its last member arrives, for every
member. A chunk that needs a neighbour stage's output first posts a recv, which ends
`p2p_transfer_ns` after both the send and the recv were posted; a send does not hold its sender
(asynchronous, as Megatron's isend), but its kernel ends with the recv. After the last backward,
`dp_collectives` reduce-scatters over each DP group, then the optimizer; the next step starts.
Each host's clock is off by a random offset; the recorded times are true time plus that offset.
Clock samples are ping-pongs against rank 0 with random round trips.

A planted slow rank multiplies its compute by `slow_factor`; `simulate` without it gives the
counterfactual step the analysis should price (`FleetTruth.lost_ns`).
"""

from __future__ import annotations

import dataclasses
import json
import time

import duckdb
import numpy as np
import pyarrow as pa

from bprof.store.reduce import FORMAT_VERSION

KIND_TP, KIND_SEND, KIND_RECV, KIND_DP = 0, 1, 2, 3
BASE_NS = 1_790_000_000_000_000_000  # recorded times are epoch-like, as Kineto's


@dataclasses.dataclass(frozen=True)
class Fleet:
    tp: int = 8
    pp: int = 8
    dp: int = 160
    microbatches: int = 16
    steps: int = 2
    tp_per_forward: int = 42  # TP all-reduces of one forward chunk (two per layer)
    tp_per_backward: int = 84
    dp_collectives: int = 40  # gradient reduce-scatters per step
    gpus_per_host: int = 8
    forward_ns: int = 2_000_000  # one micro-batch's forward compute on one stage
    backward_ns: int = 4_000_000
    tp_transfer_ns: int = 40_000
    p2p_transfer_ns: int = 150_000
    dp_transfer_ns: int = 1_500_000
    optimizer_ns: int = 3_000_000
    work_jitter: float = 0.03  # relative noise of each work segment
    clock_spread_ns: int = 2_000_000  # host clock offsets are uniform in +- this
    slow_rank: int | None = None
    slow_factor: float = 1.0
    seed: int = 0

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


@dataclasses.dataclass
class FleetTruth:
    run_id: int
    host_offset_ns: np.ndarray  # per host: its clock minus true time
    step_ns: list[int]  # the job's step (true time), per step
    healthy_step_ns: list[int] | None  # the same without the slow rank
    rows_per_rank_step: dict[str, int]  # min/max collective rows of one rank in one step
    num_collective_rows: int
    seconds: dict[str, float]

    @property
    def lost_ns(self) -> int | None:
        if self.healthy_step_ns is None:
            return None
        return int(np.median(np.subtract(self.step_ns, self.healthy_step_ns)))


def schedule_1f1b(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """(F|B, micro-batch) in the order one stage runs them: warm-up forwards, one-forward-one-backward, cool-down."""
    warmup = min(stages - 1 - stage, microbatches)
    order = [("F", m) for m in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", m) for m in range(microbatches - warmup, microbatches)]
    return order


def _stage_ops(f: Fleet, stage: int) -> list[tuple[int, str, int]]:
    """The ops of one stage in a step, in call order: (kind, F|B, micro-batch)."""
    ops = []
    for chunk, m in schedule_1f1b(stage, f.pp, f.microbatches):
        forward = chunk == "F"
        if (forward and stage > 0) or (not forward and stage < f.pp - 1):
            ops.append((KIND_RECV, chunk, m))
        ops += [(KIND_TP, chunk, m)] * (f.tp_per_forward if forward else f.tp_per_backward)
        if (forward and stage < f.pp - 1) or (not forward and stage > 0):
            ops.append((KIND_SEND, chunk, m))
    return ops + [(KIND_DP, "", j) for j in range(f.dp_collectives)]


@dataclasses.dataclass
class _Sim:
    ops: list[list[tuple[int, str, int]]]  # per stage
    arrival: list[np.ndarray]  # per stage: (steps, ops, dp, tp) true arrival
    exit: list[np.ndarray]
    step_start: np.ndarray  # (steps + 1, pp, dp, tp): start of each step, and the end of the last
    compute: np.ndarray  # (steps, pp, dp, tp) compute per step


def simulate(f: Fleet, slow: bool = True) -> _Sim:
    rng = np.random.default_rng(f.seed)
    shape = (f.pp, f.dp, f.tp)
    factor = np.ones(shape)
    if slow and f.slow_rank is not None:
        factor.reshape(-1)[f.slow_rank] = f.slow_factor
    ops = [_stage_ops(f, p) for p in range(f.pp)]
    # One warm-up step first, not recorded: ranks then start each step staggered as in a steady run
    # (the last stage finishes its backward first), not all at once.
    steps = f.steps + 1
    arrival = [np.zeros((steps, len(o), f.dp, f.tp), dtype=np.int64) for o in ops]
    exit_ = [np.zeros_like(a) for a in arrival]
    step_start = np.zeros((steps + 1, *shape), dtype=np.int64)
    compute = np.zeros((steps, *shape), dtype=np.int64)
    free = np.full(shape, 1_000_000, dtype=np.int64)  # each rank's time after its last op
    for s in range(steps):
        step_start[s] = free
        sent: dict[tuple[str, int, int], tuple[int, np.ndarray]] = {}  # (chunk, m, to stage) -> (op index, arrival)
        pos = [0] * f.pp
        last_dp = [next(i for i, o in enumerate(stage_ops) if o[0] == KIND_DP) for stage_ops in ops]
        while any(pos[p] < last_dp[p] for p in range(f.pp)):
            progressed = False
            for p in range(f.pp):
                while pos[p] < last_dp[p]:
                    kind, chunk, m = ops[p][pos[p]]
                    i = pos[p]
                    if kind == KIND_RECV:
                        key = (chunk, m, p)
                        if key not in sent:
                            break
                        send_index, send_arrival = sent.pop(key)
                        mine = free[p] + 20_000
                        end = np.maximum(mine, send_arrival) + f.p2p_transfer_ns
                        arrival[p][s, i], exit_[p][s, i] = mine, end
                        src = p - 1 if chunk == "F" else p + 1
                        exit_[src][s, send_index] = end
                        free[p] = end
                    elif kind == KIND_SEND:
                        arrival[p][s, i] = free[p] + 10_000
                        sent[(chunk, m, p + 1 if chunk == "F" else p - 1)] = (i, arrival[p][s, i].copy())
                        free[p] = arrival[p][s, i] + 5_000
                    else:
                        per = (f.forward_ns / f.tp_per_forward) if chunk == "F" else (f.backward_ns / f.tp_per_backward)
                        work = (per * factor[p] * (1 + f.work_jitter * rng.standard_normal((f.dp, f.tp)))).astype(np.int64)
                        compute[s, p] += work
                        arrive = free[p] + work
                        end = arrive.max(axis=1, keepdims=True) + f.tp_transfer_ns
                        arrival[p][s, i], exit_[p][s, i] = arrive, end
                        free[p] = np.broadcast_to(end, arrive.shape)
                    pos[p] += 1
                    progressed = True
            if not progressed:
                raise RuntimeError("1F1B schedule deadlocked: a recv has no send")
        for j in range(f.dp_collectives):
            work = (100_000 * factor * (1 + f.work_jitter * rng.standard_normal(shape))).astype(np.int64)
            compute[s] += work
            arrive = free + work
            end = arrive.max(axis=1, keepdims=True) + f.dp_transfer_ns  # DP groups: same (p, t), all d
            for p in range(f.pp):
                arrival[p][s, last_dp[p] + j], exit_[p][s, last_dp[p] + j] = arrive[p], end[p]
            free = np.broadcast_to(end, shape).copy()
        opt = (f.optimizer_ns * factor * (1 + f.work_jitter * rng.standard_normal(shape))).astype(np.int64)
        compute[s] += opt
        free = free + opt
    step_start[steps] = free
    return _Sim(ops, [a[1:] for a in arrival], [e[1:] for e in exit_], step_start[1:], compute[1:])


def job_steps(sim: _Sim) -> list[int]:
    """The job's step per step: latest end minus earliest start over all ranks."""
    return [int(sim.step_start[s + 1].max() - sim.step_start[s].min()) for s in range(len(sim.step_start) - 1)]


def write_fleet(con: duckdb.DuckDBPyConnection, f: Fleet, name: str = "fleet") -> FleetTruth:
    """Simulate `f` and insert it as one run; returns the truth."""
    seconds = {}
    t0 = time.perf_counter()
    sim = simulate(f)
    healthy = job_steps(simulate(f, slow=False)) if f.slow_rank is not None else None
    seconds["simulate"] = time.perf_counter() - t0
    rng = np.random.default_rng(f.seed + 1)
    num_hosts = -(-f.world_size // f.gpus_per_host)
    offsets = rng.integers(-f.clock_spread_ns, f.clock_spread_ns, num_hosts)
    offsets[0] = 0
    t0 = time.perf_counter()
    con.execute("BEGIN TRANSACTION")
    try:
        run_id = _insert_run(con, f, name)
        rank_offset = np.repeat(offsets, f.gpus_per_host)[:f.world_size]
        counts = [_insert_stage(con, f, sim, run_id, p, rank_offset) for p in range(f.pp)]
        _insert_per_rank(con, f, sim, run_id, rank_offset, rng)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    seconds["insert"] = time.perf_counter() - t0
    per_step = [len(o) for o in sim.ops]
    return FleetTruth(run_id, offsets, job_steps(sim), healthy, {"min": min(per_step), "max": max(per_step)},
                      sum(counts), seconds)


def _insert_run(con, f: Fleet, name: str) -> int:
    layout = {"tp": f.tp, "pp": f.pp, "dp": f.dp, "microbatches": f.microbatches, "schedule": "1f1b"}
    [(run_id,)] = con.execute(
        """INSERT INTO runs (name, ingested_at, source_path, fingerprint, world_size, num_ranks_ingested, backend,
               device_name, consistent, metadata)
           VALUES (?, now(), 'bprof.synth.fleet', ?, ?, ?, 'nccl', 'synthetic', true, ?) RETURNING run_id""",
        [name, f"fleet:{dataclasses.astuple(f)}", f.world_size, f.world_size, json.dumps({"synthetic_fleet": layout})]).fetchall()
    con.execute("""
        INSERT INTO ranks (run_id, rank, local_rank, host, trace_path, trace_sha256, trace_bytes, time_base, base_time_ns, num_events)
        SELECT ?, r, r % ?, 'node' || (r // ?), 'synthetic', '', 0, 'absolute_us', 0, 0 FROM range(?) t(r)""",
                [run_id, f.gpus_per_host, f.gpus_per_host, f.world_size])
    return run_id


def _insert_stage(con, f: Fleet, sim: _Sim, run_id: int, p: int, rank_offset: np.ndarray) -> int:
    """The collectives rows of one stage's ranks (all steps), through Arrow: no Python loop per row."""
    ops = sim.ops[p]
    n_ops, group = len(ops), f.dp * f.tp
    kind = np.array([o[0] for o in ops], dtype=np.int8)
    # per-step sequence numbers: TP ops count within the step, p2p the micro-batch, DP the index
    tp_index = np.cumsum(kind == KIND_TP) - 1
    micro = np.array([o[2] for o in ops], dtype=np.int64)
    per_step_seq = np.where(kind == KIND_TP, tp_index, micro)
    per_step_count = np.where(kind == KIND_TP, int((kind == KIND_TP).sum()),
                              np.where(kind == KIND_DP, f.dp_collectives, f.microbatches))
    forward = np.array([o[1] == "F" for o in ops])
    peer_stage = np.where(kind == KIND_SEND, np.where(forward, p + 1, p - 1),
                          np.where(kind == KIND_RECV, np.where(forward, p - 1, p + 1), -1))
    steps = np.arange(f.steps)
    # row order: step, op, (d, t)
    ranks = p * group + np.arange(group)
    rank_col = np.tile(ranks, f.steps * n_ops).astype(np.int32)
    op_col = np.tile(np.repeat(np.arange(n_ops), group), f.steps)
    step_col = np.repeat(steps, n_ops * group).astype(np.int32)
    offset = rank_offset[rank_col]
    arrival = sim.arrival[p].reshape(-1) + offset + BASE_NS
    end = sim.exit[p].reshape(-1) + offset + BASE_NS
    peer = np.where(peer_stage[op_col] >= 0, rank_col + (peer_stage[op_col] - p) * group, -1).astype(np.int32)
    table = pa.table({
        "rank": rank_col, "call_index": (step_col * n_ops + op_col).astype(np.int32),
        "kind": kind[op_col], "step": step_col,
        "seq": (step_col * per_step_count[op_col] + per_step_seq[op_col]).astype(np.int64),
        "peer": pa.array(peer, mask=peer < 0), "arrival": arrival, "dur": end - arrival,
    })
    tp, dp = f.tp, f.dp
    con.register("_fleet_rows", table)
    try:
        con.execute(f"""
            INSERT INTO collectives
            SELECT {run_id}, rank, call_index,
                CASE kind WHEN {KIND_TP} THEN 'all_reduce' WHEN {KIND_SEND} THEN 'send' WHEN {KIND_RECV} THEN 'recv'
                     ELSE 'reduce_scatter' END AS op,
                CASE kind WHEN {KIND_TP} THEN 'nccl:all_reduce' WHEN {KIND_SEND} THEN 'nccl:send'
                     WHEN {KIND_RECV} THEN 'nccl:recv' ELSE 'nccl:reduce_scatter' END,
                'c10d', kind IN ({KIND_SEND}, {KIND_RECV}), peer,
                CASE kind WHEN {KIND_TP} THEN 'tp' || (rank // {tp})
                          WHEN {KIND_DP} THEN 'dp' || ({p} * {tp} + rank % {tp})
                          ELSE 'pp' || (rank % {tp * dp}) END,
                CASE kind WHEN {KIND_TP} THEN 'TENSOR_MODEL_PARALLEL_GROUP' WHEN {KIND_DP} THEN 'DATA_PARALLEL_GROUP'
                          ELSE 'PIPELINE_MODEL_PARALLEL_GROUP' END,
                CASE kind WHEN {KIND_TP} THEN list_transform(range({tp}), lambda i: CAST(rank - rank % {tp} + i AS INTEGER))
                          WHEN {KIND_DP} THEN list_transform(range({dp}), lambda i: CAST({p * tp * dp} + i * {tp} + rank % {tp} AS INTEGER))
                          ELSE list_transform(range({f.pp}), lambda i: CAST(i * {tp * dp} + rank % {tp * dp} AS INTEGER)) END,
                CASE kind WHEN {KIND_TP} THEN {tp} WHEN {KIND_DP} THEN {dp} ELSE {f.pp} END,
                seq, 'BFloat16',
                CASE kind WHEN {KIND_DP} THEN 50_000_000 ELSE 4_194_304 END,
                CASE kind WHEN {KIND_DP} THEN 50_000_000 // {dp} ELSE 4_194_304 END,
                CASE kind WHEN {KIND_DP} THEN 100_000_000 ELSE 8_388_608 END,
                CASE kind WHEN {KIND_DP} THEN 100_000_000 // {dp} ELSE 8_388_608 END,
                1, '1', arrival - 8_000, 6_000, arrival, dur, 1, NULL, step
            FROM _fleet_rows""")
    finally:
        con.unregister("_fleet_rows")
    return len(table)


def _insert_per_rank(con, f: Fleet, sim: _Sim, run_id: int, rank_offset: np.ndarray, rng) -> None:
    """steps, what `bprof reduce` computes per rank (its spans, partition, exposed-communication
    intervals and communication per dimension: every rank is a reduced rank) and clock samples."""
    start = sim.step_start.reshape(f.steps + 1, -1)  # (steps + 1, world) in rank order p, d, t
    rank = np.tile(np.arange(f.world_size, dtype=np.int32), f.steps)
    step = np.repeat(np.arange(f.steps, dtype=np.int32), f.world_size)
    ts = start[:-1].reshape(-1) + np.tile(rank_offset, f.steps) + BASE_NS
    dur = (start[1:] - start[:-1]).reshape(-1)
    compute = sim.compute.reshape(-1)
    con.register("_fleet_steps", pa.table({"rank": rank, "step": step, "ts": ts, "dur": dur, "compute": compute}))
    try:
        con.execute(f"INSERT INTO steps (run_id, rank, step, ts_ns, dur_ns) SELECT {run_id}, rank, step, ts, dur FROM _fleet_steps")
        con.execute(f"""INSERT INTO reduced_ranks SELECT {run_id}, r, 'bprof.synth.fleet', {FORMAT_VERSION}, NULL, NULL, 0
                        FROM range({f.world_size}) t(r)""")
        con.execute(f"INSERT INTO reduced_spans (run_id, rank, step, ts_ns, dur_ns, timeline, main_tid) "
                    f"SELECT {run_id}, rank, step, ts, dur, 'device', NULL FROM _fleet_steps")
        # All communication is exposed here (compute and collectives never run at once in this
        # model) but a send's, which runs while its rank computes.
        con.execute(f"""INSERT INTO reduced_breakdown
                        SELECT {run_id}, rank, step, 'device', dur, compute, dur - compute, 0, 0, 0, 0 FROM _fleet_steps""")
    finally:
        con.unregister("_fleet_steps")
    con.execute(f"""
        INSERT INTO reduced_exposed_comm
        SELECT {run_id}, rank, step, device_ts_ns, device_dur_ns FROM collectives WHERE run_id = {run_id} AND op <> 'send'""")
    # breakdown_dims as the reduce computes it: per dimension the union of its calls' CPU calls and
    # device intervals (comm_ns), and the part of that union inside the exposed intervals. A rank
    # runs its all-reduces (tp) and reduce-scatters (dp) one at a time, each CPU call after the end
    # of the call before and ahead of its own device work, all of which is exposed: sums suffice
    # (they equal breakdown's unions in this model). Sends and receives (pp) overlap one another,
    # and a send (not exposed itself) runs on under its rank's next calls: their union is built
    # (gaps and islands), and its exposed part is E(end) - E(start) per interval, E(t) being the
    # rank's exposed time before t (its exposed intervals are disjoint). One stage's ranks at a time
    # (contiguous, as their rows are): at 10,240 ranks all at once peaked at 5.6 GiB, by stage 1.7.
    for lo in range(0, f.world_size, f.tp * f.dp):
        con.execute(f"""
            INSERT INTO reduced_dims
            WITH c AS (
                SELECT rank, step, CASE op WHEN 'all_reduce' THEN 'tp' WHEN 'reduce_scatter' THEN 'dp' ELSE 'pp' END AS dim,
                    cpu_ts_ns, cpu_dur_ns, device_ts_ns, device_dur_ns
                FROM collectives WHERE run_id = {run_id} AND rank >= $lo AND rank < $hi
            ), pp AS (
                SELECT rank, step, cpu_ts_ns AS ts_ns, cpu_ts_ns + cpu_dur_ns AS end_ns FROM c WHERE dim = 'pp'
                UNION ALL
                SELECT rank, step, device_ts_ns, device_ts_ns + device_dur_ns FROM c WHERE dim = 'pp'
            ), pp_prev AS (
                SELECT *, max(end_ns) OVER (PARTITION BY rank, step ORDER BY ts_ns, end_ns
                                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_ns
                FROM pp
            ), pp_islands AS (
                SELECT *, sum(CASE WHEN prev_end_ns IS NULL OR ts_ns > prev_end_ns THEN 1 ELSE 0 END)
                              OVER (PARTITION BY rank, step ORDER BY ts_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island
                FROM pp_prev
            ), pp_union AS (
                SELECT rank, step, min(ts_ns) AS ts_ns, max(end_ns) AS end_ns FROM pp_islands GROUP BY rank, step, island
            ), exposed AS (
                SELECT rank, ts_ns, dur_ns,
                    sum(dur_ns) OVER (PARTITION BY rank ORDER BY ts_ns ROWS UNBOUNDED PRECEDING) - dur_ns AS before_ns
                FROM reduced_exposed_comm WHERE run_id = {run_id} AND rank >= $lo AND rank < $hi
            ), ends AS (
                SELECT rank, step, ts_ns AS t, -1 AS sign FROM pp_union
                UNION ALL
                SELECT rank, step, end_ns, 1 FROM pp_union
            ), pp_exposed AS (
                SELECT e.rank, e.step, sum(e.sign * coalesce(x.before_ns + least(e.t - x.ts_ns, x.dur_ns), 0)) AS exposed_ns
                FROM ends e ASOF LEFT JOIN exposed x ON x.rank = e.rank AND x.ts_ns <= e.t
                GROUP BY e.rank, e.step
            )
            SELECT {run_id}, rank, step, dim, sum(cpu_dur_ns + device_dur_ns), sum(device_dur_ns)
            FROM c WHERE dim <> 'pp' GROUP BY rank, step, dim
            UNION ALL
            SELECT {run_id}, u.rank, u.step, 'pp', sum(u.end_ns - u.ts_ns), any_value(x.exposed_ns)
            FROM pp_union u JOIN pp_exposed x USING (rank, step) GROUP BY u.rank, u.step""", {"lo": lo, "hi": lo + f.tp * f.dp})
    # Ping-pongs against rank 0 at the start and end of the window, 4 each, round trips of 30-80 us.
    n = f.world_size * 2 * 4
    sample_rank = np.repeat(np.arange(f.world_size, dtype=np.int32), 8)
    phase = np.tile(np.repeat(np.array(["start:0", "end:0"]), 4), f.world_size)
    true_send = np.where(phase == "start:0", start[0].reshape(-1)[sample_rank] - 5_000_000,
                         start[-1].reshape(-1)[sample_rank] + 5_000_000) + np.tile(np.arange(4) * 200_000, 2 * f.world_size)
    there = rng.integers(15_000, 40_000, n)
    back = rng.integers(15_000, 40_000, n)
    con.register("_fleet_clock", pa.table({
        "rank": sample_rank, "phase": phase,
        "send": true_send + rank_offset[sample_rank] + BASE_NS,
        "reference": true_send + there + rank_offset[0] + BASE_NS,
        "recv": true_send + there + back + rank_offset[sample_rank] + BASE_NS}))
    try:
        con.execute(f"INSERT INTO clock_samples SELECT {run_id}, rank, 0, phase, send, reference, recv FROM _fleet_clock WHERE rank > 0")
    finally:
        con.unregister("_fleet_clock")
