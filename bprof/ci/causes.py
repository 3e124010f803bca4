"""Why did a run's step change? The difference of its step parts (bprof.ci.summary components) from
the baseline runs', ranked by contribution in ns per step.

The partition family (compute, exposed_wait, exposed_transfer, overlapped_comm, memcpy, idle, other
on each step's critical rank) sums to the critical rank's span, so its deltas add up to the change
of the step; the other families refine a part (which kernel class, phase, idle cause, parallel
dimension or straggler) and overlap it: they are ranked, never summed.
"""

from __future__ import annotations

from dataclasses import dataclass
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
class Explanation:
    parts: list[Cause]  # the partition, largest growth first
    refinements: list[Cause]  # every other family, largest growth first
    headline: str  # one sentence: the part that grew most, what within it, on which rank
    top_part: str | None  # name of the partition part ranked first
    critical_rank: int | None  # the candidate's critical rank
    baseline_critical_rank: int | None


def explain(candidate: RunSummary, baseline: list[RunSummary], worse_is_longer: bool = True) -> Explanation:
    """Rank the candidate's step parts by growth over the baseline (shrinkage first when `worse_is_longer`
    is False, to explain an improvement)."""
    keys = set(candidate.components)
    for b in baseline:
        keys |= set(b.components)
    causes = []
    for family, name in keys:
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
    return Explanation(parts, refinements, _headline(candidate, parts, refinements, sign, base_rank),
                       parts[0].name if parts else None, candidate.critical_rank, base_rank)


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
