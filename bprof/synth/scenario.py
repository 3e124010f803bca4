"""What a synthetic run looks like: parallel layout, trace format, clocks and planted faults.

Plain frozen dataclasses plus the Megatron-style rank topology derived from them. Nothing here
knows about trace formats or timing; `program.py` turns a Scenario into per-rank work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

FORMATS = ("modern", "2022")
SCHEDULES = ("1f1b", "gpipe")
DEVICES = ("A100", "H100")
DP_MODES = ("allreduce", "zero1")

# What each fault plants. Copied into truth.json so a test reads the contract next to the numbers.
FAULT_DOCS = {
    "slow_rank": "rank R's compute kernels (stream 7) take extra_ns more per step in total, spread "
                 "over its kernels in proportion to their duration; every peer then waits for R in "
                 "the next collective it shares with R",
    "slow_host": "every compute kernel of every rank on host H lasts factor x longer",
    "stalled_input": "the data-loading range at the start of each step lasts extra_ns longer on "
                     "rank R (all ranks when rank is None): a CPU gap with no GPU work",
    "exposed_comm": "DP gradient buckets are issued after the whole backward instead of "
                    "overlapping it (from the main thread), so their transfer is exposed",
    "stage_imbalance": "the last pipeline stage's transformer-layer kernels last factor x longer; "
                       "earlier stages wait for it (larger pipeline bubbles)",
    "slow_link": "the transfer (last arrival to end) of every collective or p2p instance whose "
                 "members span host H and another host (the inter-host 'net' link) takes factor x "
                 "longer; intra-host instances and compute kernels are unchanged",
}


@dataclass(frozen=True)
class Fault:
    """One planted fault; which fields matter depends on `kind` (see FAULT_DOCS)."""

    kind: str
    rank: int | None = None
    host: int | None = None
    extra_ns: int = 0
    factor: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_DOCS:
            raise ValueError(f"unknown fault kind {self.kind!r}; known: {sorted(FAULT_DOCS)}")
        if self.kind == "slow_rank" and (self.rank is None or self.extra_ns <= 0):
            raise ValueError("slow_rank needs rank and extra_ns > 0")
        if self.kind == "slow_host" and (self.host is None or self.factor <= 1.0):
            raise ValueError("slow_host needs host and factor > 1")
        if self.kind == "stalled_input" and self.extra_ns <= 0:
            raise ValueError("stalled_input needs extra_ns > 0")
        if self.kind == "stage_imbalance" and self.factor <= 1.0:
            raise ValueError("stage_imbalance needs factor > 1")
        if self.kind == "slow_link" and (self.host is None or self.factor <= 1.0):
            raise ValueError("slow_link needs host and factor > 1")


@dataclass(frozen=True)
class Scenario:
    """A Megatron-style TP x PP x DP training run, profiled for `steps` steps.

    `layers` counts transformer layers of the whole model (split over pipeline stages);
    `events_scale` multiplies it, which scales the events per rank roughly linearly.
    `clock_offset_ns` maps a host index to that host's clock offset; `clock_jitter_ns` bounds a
    per-host clock wander (see clock.py) and the spread of collective end times.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 2
    steps: int = 3
    first_step: int = 5
    layers: int = 4
    microbatches: int = 4
    schedule: str = "1f1b"
    hosts: int = 1
    fmt: str = "modern"
    clock_offset_ns: Mapping[int, int] = field(default_factory=dict)
    clock_jitter_ns: int = 0
    seed: int = 0
    faults: tuple[Fault, ...] = ()
    events_scale: float = 1.0
    device: str = "A100"
    dtype: str | None = None  # "bf16" | "fp16" | "fp8"; None: bf16 for modern, fp16 for 2022
    dp_mode: str = "allreduce"  # "zero1": reduce-scatter grads, all-gather params
    hidden: int = 4096
    heads: int = 32
    seq_len: int = 2048
    micro_batch_size: int = 1
    vocab: int = 32000
    start_ns: int = 1_790_857_100_000_000_000  # true (global) epoch ns of the first step

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", tuple(self.faults))
        object.__setattr__(self, "clock_offset_ns",
                           {int(k): int(v) for k, v in dict(self.clock_offset_ns).items()})
        for name in ("tp", "pp", "dp", "steps", "layers", "microbatches", "hosts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {FORMATS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}")
        if self.dp_mode not in DP_MODES:
            raise ValueError(f"dp_mode must be one of {DP_MODES}")
        if self.dtype not in (None, "bf16", "fp16", "fp8"):
            raise ValueError("dtype must be None, 'bf16', 'fp16' or 'fp8'")
        if self.dtype == "fp8" and (self.fmt != "modern" or self.device != "H100"):
            raise ValueError("dtype='fp8' needs fmt='modern' and device='H100' "
                             "(torch._scaled_mm on Hopper)")
        if self.hidden % self.heads or self.heads % self.tp or self.vocab % self.tp:
            raise ValueError("heads must divide hidden, and tp must divide heads and vocab")
        if self.world_size % self.hosts:
            raise ValueError(f"world size {self.world_size} is not divisible by hosts={self.hosts}")
        if self.events_scale <= 0:
            raise ValueError("events_scale must be > 0")
        if self.clock_jitter_ns < 0:
            raise ValueError("clock_jitter_ns must be >= 0")
        for h in self.clock_offset_ns:
            if not 0 <= h < self.hosts:
                raise ValueError(f"clock_offset_ns names host {h}, but hosts={self.hosts}")
        for f in self.faults:
            if f.rank is not None and not 0 <= f.rank < self.world_size:
                raise ValueError(f"fault {f.kind} names rank {f.rank} outside the world")
            if f.host is not None and not 0 <= f.host < self.hosts:
                raise ValueError(f"fault {f.kind} names host {f.host} outside the run")
            if f.kind == "slow_link" and self.hosts < 2:
                raise ValueError("slow_link needs hosts >= 2: one host has no inter-host link")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def num_layers(self) -> int:
        """Transformer layers after events_scale; at least one per pipeline stage."""
        return max(self.pp, round(self.layers * self.events_scale))

    @property
    def compute_dtype(self) -> str:
        if self.dtype is not None:
            return self.dtype
        return "bf16" if self.fmt == "modern" else "fp16"


@dataclass(frozen=True)
class Group:
    """A process group as torch names it: a global creation-order name and a description."""

    index: int
    name: str
    desc: str
    ranks: tuple[int, ...]

    @property
    def stride(self) -> int:
        return self.ranks[1] - self.ranks[0] if len(self.ranks) > 1 else 1


class Topology:
    """Megatron rank layout: tp fastest, then dp, then pp; ranks spread evenly over hosts."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.world = sc.world_size
        self.ranks_per_host = self.world // sc.hosts
        # Megatron creates every group on every rank in the same order, so names are global:
        # "0" is the default group, then DP groups, TP groups, PP groups (size-1 groups too).
        groups = [Group(0, "0", "default_pg", tuple(range(self.world)))]
        for desc, members in (("DATA_PARALLEL_GROUP", self._dp_groups()),
                              ("TENSOR_MODEL_PARALLEL_GROUP", self._tp_groups()),
                              ("PIPELINE_MODEL_PARALLEL_GROUP", self._pp_groups())):
            for ranks in members:
                groups.append(Group(len(groups), str(len(groups)), desc, tuple(ranks)))
        self.groups = groups
        self._of = {}
        for g in groups[1:]:
            for r in g.ranks:
                self._of[(r, g.desc)] = g

    def _dp_groups(self):
        sc = self.sc
        return [[p * sc.tp * sc.dp + d * sc.tp + t for d in range(sc.dp)]
                for p in range(sc.pp) for t in range(sc.tp)]

    def _tp_groups(self):
        sc = self.sc
        return [[p * sc.tp * sc.dp + d * sc.tp + t for t in range(sc.tp)]
                for p in range(sc.pp) for d in range(sc.dp)]

    def _pp_groups(self):
        sc = self.sc
        return [[p * sc.tp * sc.dp + d * sc.tp + t for p in range(sc.pp)]
                for d in range(sc.dp) for t in range(sc.tp)]

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp stage, dp index, tp index) of a global rank."""
        sc = self.sc
        return rank // (sc.tp * sc.dp), (rank // sc.tp) % sc.dp, rank % sc.tp

    def host(self, rank: int) -> int:
        return rank // self.ranks_per_host

    @staticmethod
    def host_name(host: int) -> str:
        """The host's name in the traces (`host_name`) and in truth.json."""
        return f"node{host}"

    def local_rank(self, rank: int) -> int:
        return rank % self.ranks_per_host

    def tp_group(self, rank: int) -> Group:
        return self._of[(rank, "TENSOR_MODEL_PARALLEL_GROUP")]

    def dp_group(self, rank: int) -> Group:
        return self._of[(rank, "DATA_PARALLEL_GROUP")]

    def pp_group(self, rank: int) -> Group:
        return self._of[(rank, "PIPELINE_MODEL_PARALLEL_GROUP")]

    def groups_of(self, rank: int) -> list[Group]:
        """The groups a rank belongs to, in creation order (what distributedInfo lists)."""
        return [g for g in self.groups if rank in g.ranks]

    def spans_hosts(self, ranks) -> bool:
        return len({self.host(r) for r in ranks}) > 1

    def link_factor(self, faults, ranks) -> float:
        """Transfer-time factor of an instance with members `ranks`: the product of the factors
        of the slow_link faults on one of its hosts, if it spans hosts (else 1)."""
        hosts = {self.host(r) for r in ranks}
        factor = 1.0
        if len(hosts) > 1:
            for f in faults:
                if f.kind == "slow_link" and f.host in hosts:
                    factor *= f.factor
        return factor

    def stage_layers(self, stage: int) -> int:
        """Transformer layers on one pipeline stage (remainder goes to the first stages)."""
        n, p = self.sc.num_layers, self.sc.pp
        return n // p + (1 if stage < n % p else 0)

    def clock_offset_ns(self, host: int) -> int:
        return self.sc.clock_offset_ns.get(host, 0)
