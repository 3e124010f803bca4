"""Prometheus metrics of a watched run: served live by `bprof record --watch --metrics-port P`,
written for a finished run by `bprof export RUN --prometheus FILE`. Both build a `Snapshot` and
turn it into the same metric families, so a dashboard reads either.

Metrics (labels: run; rank and host per rank; group and desc per process group):
    bprof_watch_iteration                  newest iteration every rank has reported
    bprof_rank_step_seconds{quantile}      a rank's step time over its last 200 iterations (0.5, 0.9, 0.99)
    bprof_rank_own_seconds                 its own time a step (busy + waiting for data), median of the score's iterations
    bprof_straggler_score                  own time over its peers' median own time (bprof.watch.live)
    bprof_host_straggler_score             the highest score of the host's ranks
    bprof_collective_blocked_seconds_total time blocked in collectives, per process group (called from Python; DDP's reducer on CPU)
    bprof_data_wait_seconds_total          time in DataLoader iterators' __next__
    bprof_gc_seconds_total                 Python garbage-collector pauses
    bprof_model_flops_per_second           declared model FLOPs a step over the median job step (when declared)
    bprof_mfu                              ... over the ranks' dense bf16 datasheet peaks (CUDA devices bprof knows)
    bprof_windows_triggered_total          trace windows the watch opened
"""

from __future__ import annotations

from dataclasses import dataclass, field

QUANTILES = (0.5, 0.9, 0.99)


@dataclass
class RankMetrics:
    rank: int
    host: str
    step_ns: list[int] = field(default_factory=list)  # recent step times
    own_ns: float | None = None
    score: float | None = None
    data_wait_ns: int = 0
    gc_ns: int = 0


@dataclass
class Snapshot:
    run: str
    iteration: int
    ranks: list[RankMetrics]
    blocked_ns: dict[tuple[int, str, str], int]  # (rank, pg name, pg desc) -> ns
    windows_triggered: int
    model_flops_per_step: float | None = None
    median_step_ns: float | None = None
    peak_flops_per_s: float | None = None  # the ranks' dense bf16 datasheet peaks summed; None when unknown


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between the sorted values (numpy's default)."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def families(snap: Snapshot) -> list:
    """The metric families of a snapshot (prometheus_client's core types)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    run = snap.run
    iteration = GaugeMetricFamily("bprof_watch_iteration", "Newest iteration every rank has reported.", labels=["run"])
    iteration.add_metric([run], snap.iteration)
    steps = GaugeMetricFamily("bprof_rank_step_seconds", "A rank's step time over its last 200 iterations.",
                              labels=["run", "rank", "host", "quantile"])
    own = GaugeMetricFamily("bprof_rank_own_seconds", "A rank's own time a step (busy and waiting for data, not for "
                            "peers): median over the straggler score's iterations.", labels=["run", "rank", "host"])
    score = GaugeMetricFamily("bprof_straggler_score", "A rank's own time over its peers' median own time.",
                              labels=["run", "rank", "host"])
    host_score = GaugeMetricFamily("bprof_host_straggler_score", "The highest straggler score of the host's ranks.",
                                   labels=["run", "host"])
    data = CounterMetricFamily("bprof_data_wait_seconds", "Time in DataLoader iterators' __next__.",
                               labels=["run", "rank", "host"])
    gc = CounterMetricFamily("bprof_gc_seconds", "Python garbage-collector pauses.", labels=["run", "rank", "host"])
    by_host: dict[str, float] = {}
    for r in snap.ranks:
        labels = [run, str(r.rank), r.host]
        for q in QUANTILES if r.step_ns else ():
            steps.add_metric([*labels, str(q)], quantile(r.step_ns, q) / 1e9)
        if r.own_ns is not None:
            own.add_metric(labels, r.own_ns / 1e9)
        if r.score is not None:
            score.add_metric(labels, r.score)
            by_host[r.host] = max(by_host.get(r.host, r.score), r.score)
        data.add_metric(labels, r.data_wait_ns / 1e9)
        gc.add_metric(labels, r.gc_ns / 1e9)
    for host, value in sorted(by_host.items()):
        host_score.add_metric([run, host], value)
    hosts = {r.rank: r.host for r in snap.ranks}
    blocked = CounterMetricFamily("bprof_collective_blocked_seconds", "Time blocked in collectives, per process group: "
                                  "synchronous calls and async Work.wait() from Python; on a CPU rank, "
                                  "DDP's reducer's wait at the end of backward.",
                                  labels=["run", "rank", "host", "group", "desc"])
    for (rank, name, desc), ns in sorted(snap.blocked_ns.items()):
        blocked.add_metric([run, str(rank), hosts.get(rank, ""), name, desc], ns / 1e9)
    windows = CounterMetricFamily("bprof_windows_triggered", "Trace windows the watch opened.", labels=["run"])
    windows.add_metric([run], snap.windows_triggered)
    out = [iteration, steps, own, score, host_score, blocked, data, gc, windows]
    if snap.model_flops_per_step and snap.median_step_ns:
        flops = GaugeMetricFamily("bprof_model_flops_per_second", "Declared model FLOPs a step over the median step.",
                                  labels=["run"])
        flops.add_metric([run], snap.model_flops_per_step / (snap.median_step_ns / 1e9))
        out.append(flops)
        if snap.peak_flops_per_s:
            mfu = GaugeMetricFamily("bprof_mfu", "Model FLOPs utilisation: declared model FLOPs a step over the median "
                                    "step and the ranks' dense bf16 datasheet peaks.", labels=["run"])
            mfu.add_metric([run], snap.model_flops_per_step / (snap.median_step_ns / 1e9) / snap.peak_flops_per_s)
            out.append(mfu)
    return out


class SnapshotCollector:
    """A prometheus_client collector that asks `get_snapshot()` at every scrape."""

    def __init__(self, get_snapshot):
        self.get_snapshot = get_snapshot

    def collect(self):
        snap = self.get_snapshot()
        return families(snap) if snap is not None else []


def text(snap: Snapshot) -> str:
    """The snapshot in Prometheus's text exposition format."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snap))
    return generate_latest(registry).decode()


def serve(get_snapshot, port: int, addr: str = "0.0.0.0"):
    """Serve the metrics on addr:port in a daemon thread; returns (server, thread)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(get_snapshot))
    return start_http_server(port, addr=addr, registry=registry)
