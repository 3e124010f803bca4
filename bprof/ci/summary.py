"""A run reduced to what the CI gate compares: robust per-run metric summaries, the facts that make
two runs comparable, and the parts of its step (for saying why a metric moved).

Reads runs, metrics, step_metrics, findings and the analyzers' breakdown_steps, breakdown_dims,
kernels_classes, phases_steps, idle_causes and stragglers_ranks of an analysed run; writes nothing.

- A step's job step time is its longest rank span (as the metrics analyzer defines it); MFU of a step
  is model FLOPs / (job step time x peak per device x world size). The run's value is the median over
  its kept steps; outlier steps (checkpoint, evaluation, warm-up) are excluded by a modified z-score
  above 3.5 and listed.
- The critical rank of a step is the one with the largest span minus time spent waiting for peers
  (exposed_wait_ns): the rank that set the pace. A waiting rank's wait is an effect, not a cause.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from statistics import median

import duckdb

from bprof.analyzers.base import table_exists
from bprof.ci.stats import robust_keep, spread_frac
from bprof.errors import DataError

# what the CLI calls a metric -> (its name in the store, unit, "higher" or "lower" is better)
METRICS = {"step_time": ("step_time_ns", "ns", "lower"), "mfu": ("mfu_frac", "frac", "higher"),
           "executed_flops": ("executed_flops_per_step", "flops", "lower"),
           "collective_calls": ("collective_calls_per_step", "calls", "lower"),
           "collective_bytes": ("collective_bytes_per_step", "bytes", "lower")}
# Work metrics: amounts, not times. A run's value is the median over kept steps of the busiest rank's
# amount per step; the same code does the same work however loaded the machine, so on a noisy shared
# runner they show a change of work (an extra matmul loop, recompute, unbucketed all-reduces) that
# the time metrics' noise hides. Per rank they are components of family work_<quantity>, "rank R".
WORK = {"executed_flops_per_step": "work_flops", "collective_calls_per_step": "work_calls",
        "collective_bytes_per_step": "work_bytes"}
# declared parallel layout keys of the bprof_model metadata (bprof.set_model_flops), when present
LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "ep", "microbatches", "schedule")
MFU_ONLY_FACTS = ("peak_flops_per_s_per_device",)  # differ -> MFU is not comparable; step time still is


@dataclass
class MetricSummary:
    value: float | None  # median over kept steps; None when not measurable
    unit: str
    num_steps: int = 0
    excluded_steps: list[int] = field(default_factory=list)
    step_spread_frac: float | None = None
    not_measurable: str | None = None


@dataclass
class RunSummary:
    run_name: str
    fingerprint: str
    benchmark: str | None
    git_sha: str | None
    git_branch: str | None
    tags: list[str]
    started_at: str | None
    facts: dict  # comparability facts; None values are unknown
    metrics: dict[str, MetricSummary]  # by store name (step_time_ns, mfu_frac)
    components: dict[tuple[str, str], int]  # (family, name) -> ns per step; work_* families: amount per step
    critical_rank: int | None = None
    critical_rank_frac: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["components"] = [[f, n, v] for (f, n), v in sorted(self.components.items())]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RunSummary":
        d = dict(d)
        d["metrics"] = {k: MetricSummary(**v) for k, v in d["metrics"].items()}
        d["components"] = {(f, n): int(v) for f, n, v in d["components"]}
        return cls(**d)


def summarize(con: duckdb.DuckDBPyConnection, run_id: int) -> RunSummary:
    """The summary of an analysed run (a DataError naming the fix when it was not analysed)."""
    row = con.execute("""
        SELECT name, fingerprint, benchmark, git_sha, git_branch, tags, CAST(started_at AS VARCHAR), device_name,
               world_size, num_ranks_ingested, backend, model_flops_per_step, metadata
        FROM runs WHERE run_id = ?""", [run_id]).fetchone()
    (name, fingerprint, benchmark, git_sha, git_branch, tags, started_at, device_name, world_size, num_ranks,
     backend, model_flops, metadata) = row
    # the job step time of each step: its longest rank span (step_metrics are per rank)
    steps = con.execute("""
        SELECT step, max(value) FROM step_metrics WHERE run_id = ? AND name = 'step_time_ns' AND value IS NOT NULL
        GROUP BY step ORDER BY step""", [run_id]).fetchall()
    if not steps:
        raise DataError(f"run {name!r} has no analysed steps: run `bprof analyze {name}` first")
    metric_values = dict(con.execute("SELECT name, value FROM metrics WHERE run_id = ?", [run_id]).fetchall())
    meta = json.loads(metadata) if metadata else {}
    model = meta.get("bprof_model") or {}
    facts = {
        "device_name": device_name, "world_size": world_size, "num_ranks_ingested": num_ranks, "backend": backend,
        "model_flops_per_step": model_flops,
        **{k: (meta.get("environment") or {}).get(k) for k in ("torch_version", "cuda_version", "nccl_version",
                                                                 "intra_op_threads")},
        "declared_layout": {k: model[k] for k in LAYOUT_KEYS if k in model} or None,
        "process_groups": _process_groups(con, run_id),
        "peak_flops_per_s_per_device": metric_values.get("peak_flops_per_s_per_device"),
    }

    kept = robust_keep([float(v) for _, v in steps])
    excluded_steps = [steps[i][0] for i in kept.excluded]
    kept_steps = [s for s, _ in steps if s not in excluded_steps]
    step_ns = kept.values
    metrics = {"step_time_ns": MetricSummary(median(step_ns), "ns", len(steps), excluded_steps, spread_frac(step_ns))}
    peak = facts["peak_flops_per_s_per_device"]
    if model_flops and peak and world_size:
        mfu = [model_flops / (ns * 1e-9 * peak * world_size) for ns in step_ns]
        metrics["mfu_frac"] = MetricSummary(median(mfu), "frac", len(steps), excluded_steps, spread_frac(mfu))
    else:
        metrics["mfu_frac"] = MetricSummary(None, "frac", len(steps), excluded_steps,
                                            not_measurable=_mfu_reason(con, run_id, model_flops, peak))
    components, critical, critical_frac = _components(con, run_id, kept_steps)
    for store_name, (value, spread, per_rank, why) in _work(con, run_id, kept_steps).items():
        unit = next(u for name, u, _ in METRICS.values() if name == store_name)
        metrics[store_name] = MetricSummary(value, unit, len(steps), excluded_steps, spread, why)
        components |= {(WORK[store_name], f"rank {rank}"): int(round(v)) for rank, v in per_rank.items()}
    return RunSummary(name, fingerprint, benchmark, git_sha, git_branch, list(tags or []), started_at, facts, metrics,
                      components, critical, critical_frac)


# amount per rank and kept step of each work metric; queries take $run_id and $steps
_WORK_SQL = {
    "executed_flops_per_step": """
        SELECT rank, step, executed_flops FROM kernels_flops
        WHERE run_id = $run_id AND list_contains($steps, step) AND executed_flops IS NOT NULL""",
    "collective_calls_per_step": """
        SELECT rank, step, count(*) FROM collectives
        WHERE run_id = $run_id AND list_contains($steps, step) GROUP BY rank, step""",
    "collective_bytes_per_step": """
        SELECT rank, step, sum(in_bytes) FROM collectives
        WHERE run_id = $run_id AND list_contains($steps, step) AND in_bytes IS NOT NULL GROUP BY rank, step""",
}
_WORK_TABLES = {"executed_flops_per_step": "kernels_flops", "collective_calls_per_step": "collectives",
                "collective_bytes_per_step": "collectives"}
_WORK_MISSING = {
    "executed_flops_per_step": "no executed FLOPs from recorded shapes (bprof record records shapes; analyse the run)",
    "collective_calls_per_step": "no collectives in its kept steps",
    "collective_bytes_per_step": "no collective message sizes in its kept steps",
}


def _work(con, run_id: int, kept_steps: list[int]) -> dict[str, tuple]:
    """Each work metric: (median over kept steps of the largest amount of any rank, the spread of those
    per-step values, {rank: median over kept steps of its amount}, why it is not measurable or None).
    A rank without a row in a kept step did none of that work there (0)."""
    ranks = [r for (r,) in con.execute("""SELECT DISTINCT rank FROM step_metrics
                                          WHERE run_id = ? AND name = 'step_time_ns' ORDER BY rank""", [run_id]).fetchall()]
    out = {}
    for store_name, sql in _WORK_SQL.items():
        rows = con.execute(sql, {"run_id": run_id, "steps": kept_steps}).fetchall() \
            if kept_steps and table_exists(con, _WORK_TABLES[store_name]) else []
        if not rows:
            out[store_name] = (None, None, {}, _WORK_MISSING[store_name])
            continue
        amount = {(rank, step): float(v) for rank, step, v in rows}
        busiest = [max(amount.get((r, s), 0.0) for r in ranks) for s in kept_steps]
        per_rank = {r: median(amount.get((r, s), 0.0) for s in kept_steps) for r in ranks}
        out[store_name] = (median(busiest), spread_frac(busiest), per_rank, None)
    return out


def _process_groups(con, run_id: int) -> list[str] | None:
    """The run's process groups as 'dim x size' (breakdown_groups), e.g. ['dp x 2']; None before analysis."""
    if not table_exists(con, "breakdown_groups"):
        return None
    rows = con.execute("""SELECT DISTINCT dim || ' x ' || group_size FROM breakdown_groups
                          WHERE run_id = ? AND dim IS NOT NULL ORDER BY 1""", [run_id]).fetchall()
    return [r[0] for r in rows]


def _mfu_reason(con, run_id: int, model_flops, peak) -> str:
    if not model_flops:
        return "the run declared no model FLOPs (bprof.set_model_flops)"
    if not peak:
        return "the device peak is unknown (run `bprof calibrate` on the host, or analyze with --peak-tflops)"
    return "the world size is unknown"


# Per-step parts of the critical rank's step. Each query takes $run_id and $steps (the kept steps) and
# returns (family, name, step, value_ns) for the critical rank of each step only (the _critical table).
_CRITICAL = """
    CREATE OR REPLACE TEMP TABLE _ci_critical AS
    SELECT step, rank FROM (
        SELECT step, rank, row_number() OVER (PARTITION BY step
                                              ORDER BY span_ns - coalesce(exposed_wait_ns, 0) DESC, rank) AS k
        FROM breakdown_steps WHERE run_id = $run_id AND list_contains($steps, step))
    WHERE k = 1"""
# the partition (sums to the critical rank's span); exposed communication split into waiting and
# transfer where cross-rank analysis could, else as one part
_PARTITION = """
    SELECT 'partition' AS family, part.name, b.step, part.value_ns
    FROM breakdown_steps b JOIN _ci_critical c USING (step, rank),
    LATERAL (VALUES ('compute', b.compute_ns),
                    ('exposed_wait', b.exposed_wait_ns),
                    ('exposed_transfer', b.exposed_transfer_ns),
                    ('exposed_comm', CASE WHEN b.exposed_wait_ns IS NULL THEN b.exposed_comm_ns END),
                    ('overlapped_comm', b.overlapped_comm_ns),
                    ('memcpy', b.memcpy_ns), ('idle', b.idle_ns), ('other', b.other_ns)) AS part(name, value_ns)
    WHERE b.run_id = $run_id AND part.value_ns IS NOT NULL"""
_FAMILIES = {
    "kernels_classes": """SELECT 'kernel_class', fine_class, step, dur_ns FROM kernels_classes JOIN _ci_critical USING (step, rank)
                          WHERE run_id = $run_id""",
    "phases_steps": """SELECT 'phase', phase, step, dur_ns FROM phases_steps JOIN _ci_critical USING (step, rank)
                       WHERE run_id = $run_id""",
    "idle_causes": """SELECT 'idle_cause', cause, step, dur_ns FROM idle_causes JOIN _ci_critical USING (step, rank)
                      WHERE run_id = $run_id""",
    "breakdown_dims": """SELECT 'comm_dim', dim, step, exposed_comm_ns FROM breakdown_dims JOIN _ci_critical USING (step, rank)
                         WHERE run_id = $run_id""",
}


def _components(con, run_id: int, kept_steps: list[int]) -> tuple[dict, int | None, float | None]:
    """(family, name) -> median over kept steps of its ns on the step's critical rank (0 where a step
    lacks it); plus flagged stragglers' lost_ns, and the most frequent critical rank and its share."""
    if not table_exists(con, "breakdown_steps") or not kept_steps:
        return {}, None, None
    con.execute(_CRITICAL, {"run_id": run_id, "steps": kept_steps})
    critical = [r for (r,) in con.execute("SELECT rank FROM _ci_critical ORDER BY step").fetchall()]
    rows = con.execute(_PARTITION, {"run_id": run_id}).fetchall()
    for table, sql in _FAMILIES.items():
        if table_exists(con, table):
            rows += con.execute(sql, {"run_id": run_id}).fetchall()
    con.execute("DROP TABLE _ci_critical")
    per_step: dict[tuple[str, str], dict[int, int]] = {}
    for family, name, step, value in rows:
        by_step = per_step.setdefault((family, name), {})
        by_step[step] = by_step.get(step, 0) + int(value)
    out = {key: int(round(median([by_step.get(s, 0) for s in kept_steps]))) for key, by_step in per_step.items()}
    if table_exists(con, "stragglers_ranks"):
        for rank, lost_ns in con.execute("""SELECT rank, lost_ns FROM stragglers_ranks
                                            WHERE run_id = ? AND flagged AND lost_ns IS NOT NULL""", [run_id]).fetchall():
            out[("straggler", f"rank {rank}")] = int(lost_ns)
    if not critical:
        return out, None, None
    rank, count = Counter(critical).most_common(1)[0]
    return out, rank, count / len(critical)


def comparability(candidate: dict, baseline: dict, with_mfu: bool) -> list[str]:
    """How two runs' facts differ ('torch_version 2.13.0 vs 2.12.1'); empty when comparable. A fact
    unknown on either side is not held against them (see unknown_facts)."""
    out = []
    for key in sorted(set(candidate) | set(baseline)):
        if key in MFU_ONLY_FACTS and not with_mfu:
            continue
        a, b = candidate.get(key), baseline.get(key)
        if a is None or b is None or a == b:
            continue
        if isinstance(a, float) and isinstance(b, float) and abs(a - b) <= 1e-9 * max(abs(a), abs(b)):
            continue
        out.append(f"{key} {_show(a)} (candidate) vs {_show(b)} (baseline)")
    return out


def unknown_facts(candidate: dict, baseline: dict) -> list[str]:
    """Facts known on one side only (None on both, such as the CUDA version of CPU runs, is agreement)."""
    return sorted(k for k in set(candidate) | set(baseline) if (candidate.get(k) is None) != (baseline.get(k) is None))


def _show(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)
