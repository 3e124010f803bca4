"""Point-to-point messages, counted per (group, sender, receiver) so send/recv pairs match.

The Flight Recorder of torch 2.13 records no gloo send/recv, and gloo traces name neither the
group nor the peer. So the recorder wraps torch.distributed's send/recv/isend/irecv (the module
attributes batch_isend_irecv and user code call): each call bumps a counter for its directed
pair, always (a dict update, so windows on different ranks agree on the numbering), and inside a
capture window also logs the call's group, peer, sequence number and time span.
"""

from __future__ import annotations

import functools
import time

_FUNCTIONS = (("send", "dst", "group_dst"), ("isend", "dst", "group_dst"),
              ("recv", "src", "group_src"), ("irecv", "src", "group_src"))


class P2PLog:
    def __init__(self, rank: int | None):  # None: the default group's rank, asked at each call
        self.rank = rank
        self.counts: dict[tuple, int] = {}
        self.recording = False
        self.entries: list[dict] = []

    def install(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name, peer_kw, group_peer_kw in _FUNCTIONS:
            original = getattr(c10d, name)
            if getattr(original, "_bprof_wrapped", False):
                continue
            wrapped = self._wrap(original, "recv" if "recv" in name else "send", peer_kw, group_peer_kw)
            # both names: batch_isend_irecv compares P2POp.op with c10d's own global `isend`
            setattr(c10d, name, wrapped)
            setattr(dist, name, wrapped)

    def _wrap(self, fn, kind: str, peer_kw: str, group_peer_kw: str):
        log = self

        @functools.wraps(fn)
        def wrapper(tensor, *args, **kwargs):
            t0 = time.time_ns()
            result = fn(tensor, *args, **kwargs)
            try:
                log._count(kind, tensor, args, kwargs, peer_kw, group_peer_kw, t0)
            except Exception:  # bookkeeping must never break the user's send
                pass
            return result

        wrapper._bprof_wrapped = True
        return wrapper

    def _count(self, kind, tensor, args, kwargs, peer_kw, group_peer_kw, t0) -> None:
        import torch.distributed as dist

        peer = args[0] if args else kwargs.get(peer_kw)
        group = args[1] if len(args) > 1 else kwargs.get("group")
        group_peer = args[3] if len(args) > 3 else kwargs.get(group_peer_kw)
        group = group if group is not None else dist.group.WORLD
        if peer is None and group_peer is not None:
            peer = dist.get_global_rank(group, group_peer)
        name = getattr(group, "group_name", None) or dist.distributed_c10d._get_process_group_name(group)
        me = self.rank if self.rank is not None else dist.get_rank()
        src, dst = (me, peer) if kind == "send" else (peer, me)
        key = (name, src, dst)
        seq = self.counts.get(key, 0) + 1
        self.counts[key] = seq
        if self.recording:
            self.entries.append({
                "profiling_name": f"p2p:{kind}", "process_group": [name, getattr(group, "group_desc", None)],
                "is_p2p": True, "p2p_seq_id": seq, "peer_rank": peer, "time_created_ns": t0,
                "time_done_ns": time.time_ns(), "input_sizes": [list(tensor.shape)],
                "input_dtypes": [str(tensor.dtype).removeprefix("torch.").capitalize()],
                "output_sizes": [list(tensor.shape)], "bprof_p2p": True})
