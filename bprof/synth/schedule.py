"""Pipeline schedules as per-stage action lists (what each stage does, in program order).

Actions: ("F", mb), ("B", mb), ("send_f", mb), ("recv_f", mb), ("send_b", mb), ("recv_b", mb).
1F1B follows Megatron-LM's `forward_backward_pipelining_without_interleaving`, including the
order of the paired p2p calls (send_forward_recv_backward sends first, send_backward_recv_forward
receives first), which is what keeps blocking send/recv pairs from deadlocking.
"""

from __future__ import annotations


def stage_actions(schedule: str, stage: int, stages: int, microbatches: int) -> list[tuple]:
    if schedule == "gpipe":
        return _gpipe(stage, stages, microbatches)
    return _one_f_one_b(stage, stages, microbatches)


def _p2p(acts, stage, stages, kind, mb):
    first, last = stage == 0, stage == stages - 1
    if kind in ("recv_f", "send_b") and first:
        return
    if kind in ("send_f", "recv_b") and last:
        return
    acts.append((kind, mb))


def _gpipe(stage, stages, m):
    acts: list[tuple] = []
    for i in range(m):
        _p2p(acts, stage, stages, "recv_f", i)
        acts.append(("F", i))
        _p2p(acts, stage, stages, "send_f", i)
    for i in range(m):
        _p2p(acts, stage, stages, "recv_b", i)
        acts.append(("B", i))
        _p2p(acts, stage, stages, "send_b", i)
    return acts


def _one_f_one_b(stage, stages, m):
    acts: list[tuple] = []
    warmup = min(stages - stage - 1, m)
    remaining = m - warmup
    for i in range(warmup):
        _p2p(acts, stage, stages, "recv_f", i)
        acts.append(("F", i))
        _p2p(acts, stage, stages, "send_f", i)
    if remaining:
        _p2p(acts, stage, stages, "recv_f", warmup)
    for i in range(remaining):
        f, b = warmup + i, i
        acts.append(("F", f))
        _p2p(acts, stage, stages, "send_f", f)
        _p2p(acts, stage, stages, "recv_b", b)
        acts.append(("B", b))
        if i < remaining - 1:
            _p2p(acts, stage, stages, "recv_f", f + 1)
        _p2p(acts, stage, stages, "send_b", b)
    for i in range(warmup):
        b = remaining + i
        _p2p(acts, stage, stages, "recv_b", b)
        acts.append(("B", b))
        _p2p(acts, stage, stages, "send_b", b)
    return acts


def bubble_frac(schedule: str, stages: int, microbatches: int) -> float:
    """Theoretical idle fraction of a stage for equal per-stage work: (p-1)/(m+p-1)."""
    return (stages - 1) / (microbatches + stages - 1)
