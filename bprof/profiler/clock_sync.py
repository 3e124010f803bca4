"""Clock-sync samples: each host's local rank 0 ping-pongs with global rank 0 through the job's store.

Ranks on one host share a clock; hosts do not. At a window's start and end every host's first
rank (the client) exchanges ROUNDS timestamp ping-pongs with global rank 0 (the reference) over
the distributed store the job already has. A sample (t_send, t_ref, t_recv) gives the offset
t_ref - (t_send + t_recv) / 2 with an error of at most half the round trip; analysis keeps the
samples with the lowest round trips. Both sides reach this point at the same iteration boundary,
with no collective in between, so waiting on the store cannot deadlock.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

ROUNDS = 16
TIMEOUT = timedelta(seconds=60)


def exchange(phase: str, rank: int, world_size: int, clock_shift_ns: int = 0) -> list[list[int]] | None:
    """Run one exchange; returns this rank's samples (clients), [] on the reference, None if not taking part."""
    import torch.distributed as dist

    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if not dist.is_initialized() or local_world >= world_size or world_size % local_world:
        return None
    clients = list(range(local_world, world_size, local_world))
    if rank != 0 and rank not in clients:
        return None
    store = dist.distributed_c10d._get_default_store()

    def now() -> int:
        return time.time_ns() + clock_shift_ns

    def key(client: int, i: int, what: str) -> str:
        return f"bprof/clock/{phase}/{client}/{i}/{what}"

    if rank == 0:
        for client in clients:
            for i in range(ROUNDS):
                store.wait([key(client, i, "ping")], TIMEOUT)
                store.set(key(client, i, "pong"), str(now()))
        return []
    samples = []
    for i in range(ROUNDS):
        t_send = now()
        store.set(key(rank, i, "ping"), str(t_send))
        store.wait([key(rank, i, "pong")], TIMEOUT)
        t_recv = now()
        samples.append([t_send, int(store.get(key(rank, i, "pong"))), t_recv])
    return samples
