"""Why did a run's step change? The difference of its step parts (bprof.ci.summary components) from
the baseline runs', ranked by contribution in ns per step.

The partition family (compute, exposed_wait, exposed_transfer, overlapped_comm, memcpy, idle, other
on each step's critical rank) sums to the critical rank's span, so its deltas add up to the change
of the step; the other families refine a part (which kernel class, phase, idle cause, parallel
dimension or straggler) and overlap it: they are ranked, never summed. The work families (executed
FLOPs, collective calls and bytes per step of each rank) are amounts, not times: any change of them
is listed apart, largest relative change first, and leads the headline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median

from bprof.ci.stats import MAD_TO_SIGMA
from bprof.ci.summary import RunSummary

# which finer families explain growth of each partition part
REFINES = {
    "compute": ("kernel_class", "phase"),
    "idle": ("idle_cause", "phase"),
    "other": ("phase",),
    "memcpy": ("kernel_class", "phase"),
    "exposed_wait": ("straggler", "comm_dim"),
    "exposed_transfer": ("comm_dim",),
    "exposed_comm": ("comm_dim", "straggler"),
    "overlapped_comm": ("comm_dim",),
}
NOISE_SIGMAS = 3.0  # a delta within 3 robust sds of the baseline runs' values is marked as noise
# work families (bprof.ci.summary.WORK): amounts per step on one rank, compared apart from the times
WORK_FAMILIES = {"work_flops": "executed FLOPs", "work_calls": "collective calls", "work_bytes": "collective bytes"}


@dataclass
class Cause:
    family: str
    name: str
    baseline_ns: int  # median over the baseline runs (0 where a run lacks the part)
    candidate_ns: int
    delta_ns: int  # candidate - baseline
    noise_ns: int  # 1.4826 * MAD of the baseline runs' values
    within_noise: bool  # |delta| <= NOISE_SIGMAS * noise_ns

    def label(self) -> str:
        family = {"partition": "", "kernel_class": "kernel class ", "phase": "phase ", "idle_cause": "idle cause ",
                  "comm_dim": "exposed comm of ", "straggler": "straggler "}.get(self.family, self.family + " ")
        return f"{family}{self.name}"


@dataclass
class WorkChange:
    family: str  # work_flops, work_calls or work_bytes
    name: str  # rank R
    baseline: float  # median over the baseline runs (0 where a run lacks the rank)
    candidate: float
    change_frac: float | None  # candidate / baseline - 1; None when the baseline did none of it

    def label(self) -> str:
        return f"{WORK_FAMILIES[self.family]} on {self.name}"


@dataclass
class Explanation:
    parts: list[Cause]  # the partition, largest growth first
    refinements: list[Cause]  # every other family, largest growth first
    headline: str  # one sentence: the part that grew most, what within it, on which rank
    top_part: str | None  # name of the partition part ranked first
    critical_rank: int | None  # the candidate's critical rank
    baseline_critical_rank: int | None
    work: list[WorkChange] = field(default_factory=list)  # amounts per step that changed, largest change first


def explain(candidate: RunSummary, baseline: list[RunSummary], worse_is_longer: bool = True) -> Explanation:
    """Rank the candidate's step parts by growth over the baseline (shrinkage first when `worse_is_longer`
    is False, to explain an improvement)."""
    keys = set(candidate.components)
    for b in baseline:
        keys |= set(b.components)
    causes, work = [], []
    for family, name in keys:
        if family in WORK_FAMILIES:
            values = [b.components.get((family, name), 0) for b in baseline]
            base, cand = (median(values) if values else 0), candidate.components.get((family, name), 0)
            if cand != base:
                work.append(WorkChange(family, name, base, cand, cand / base - 1.0 if base else None))
            continue
        values = [b.components.get((family, name), 0) for b in baseline]
        base = median(values) if values else 0
        noise = MAD_TO_SIGMA * median(abs(v - base) for v in values) if values else 0
        cand = candidate.components.get((family, name), 0)
        delta = cand - base
        causes.append(Cause(family, name, int(round(base)), cand, int(round(delta)), int(round(noise)),
                            abs(delta) <= NOISE_SIGMAS * noise))
    sign = 1 if worse_is_longer else -1
    order = sorted(causes, key=lambda c: (-sign * c.delta_ns, c.family, c.name))
    parts = [c for c in order if c.family == "partition"]
    refinements = [c for c in order if c.family != "partition"]
    ranks = [b.critical_rank for b in baseline if b.critical_rank is not None]
    base_rank = max(set(ranks), key=ranks.count) if ranks else None
    work.sort(key=lambda w: (-(abs(w.change_frac) if w.change_frac is not None else math.inf), w.family, w.name))
    headline = _headline(candidate, parts, refinements, sign, base_rank)
    if work:
        headline = f"{_work_text(work)}; step parts: {headline}"
    return Explanation(parts, refinements, headline, parts[0].name if parts else None, candidate.critical_rank,
                       base_rank, work)


def _work_text(work: list[WorkChange]) -> str:
    """The largest change of work, e.g. 'executed FLOPs on rank 1 grew +35.0%/step (864M -> 1.17G)'."""
    top = work[0]
    verb = "grew" if top.candidate > top.baseline else "shrank"
    change = f" {top.change_frac:+.1%}/step" if top.change_frac is not None else ""
    text = f"{top.label()} {verb}{change} ({_amount(top.baseline)} -> {_amount(top.candidate)})"
    if len(work) > 1:
        text += f"; {len(work) - 1} other work amount(s) changed"
    return text


def _amount(x: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _headline(candidate: RunSummary, parts: list[Cause], refinements: list[Cause], sign: int,
              base_rank: int | None) -> str:
    if not parts:
        return "no step parts to compare (analyse the runs with bprof analyze first)"
    top = parts[0]
    verb = "grew" if sign > 0 else "shrank"
    if sign * top.delta_ns <= 0:
        return f"no part of the critical rank's step {verb}"
    where = ""
    if candidate.critical_rank is not None:
        where = f" on rank {candidate.critical_rank} (critical in {candidate.critical_rank_frac:.0%} of steps"
        where += f"; baseline: rank {base_rank})" if base_rank is not None else ")"
    text = f"{top.label()}{where} {verb} {_ms(top.delta_ns)}/step"
    if top.within_noise:
        text += " (within the baseline's noise)"
    inner = [c for c in refinements if c.family in REFINES.get(top.name, ()) and sign * c.delta_ns > 0][:2]
    if inner:
        text += "; within it: " + ", ".join(f"{c.label()} {_ms(c.delta_ns)}" for c in inner)
    new_stragglers = [c for c in refinements if c.family == "straggler" and c.baseline_ns == 0 and c.candidate_ns > 0]
    if new_stragglers and not any(c is s for c in inner for s in new_stragglers):
        s = new_stragglers[0]
        text += f"; {s.name} is a new straggler (costs {_ms(s.candidate_ns, signed=False)}/step)"
    return text


def _ms(ns: int, signed: bool = True) -> str:
    return f"{ns / 1e6:+.2f} ms" if signed else f"{ns / 1e6:.2f} ms"
