"""`bprof record --watch`, inside each rank: per-iteration telemetry with no profiler on.

At every iteration boundary (the optimizer-step hook of rank_hook) the rank appends one row to a
ring in memory: the iteration's wall time, its busy time, the time it waited for data, paused in
Python's garbage collector and blocked in collectives (below: which), and whether a trace
window was open. Every `flush_every` rows, or `flush_s` seconds, whichever comes first, the ring is
written as one Parquet file, under a temporary name then renamed, so a reader never sees half a
file (bprof.watch.files reads them; its docstring lists the columns).

What each column can see, by backend:
- busy_ns is the CPU time of the thread that runs the optimizer step (time.thread_time_ns): on a
  CPU rank, its compute and Python, none of its waits (gloo's waits sleep). On a CUDA rank the
  device's work is not in it; bprof has no device-side busy time between windows yet.
- blocked_ns counts the collectives the script calls from Python: a synchronous call's duration and
  an async Work's wait(). DDP's reducer issues its buckets from autograd hooks and waits for them in
  C++ at the end of backward, out of Python's sight: on a CPU rank, the time the training thread is
  off the CPU inside backward (wall minus thread CPU time, less the Python waits above) is counted
  as blocked in the DDP module's process group. That is the wait for the buckets' all-reduces, plus
  any time the thread was runnable but preempted on an oversubscribed host. On a CUDA rank backward
  runs on autograd's device threads and the host does not wait for the buckets, so nothing is
  counted there; the device's collective time needs a trace window.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import threading
import time
from pathlib import Path

# the torch.distributed collectives whose synchronous calls count as blocked time
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                "broadcast", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier",
                "all_gather_object", "broadcast_object_list")
FLUSH_EVERY = int(os.environ.get("BPROF_WATCH_FLUSH_EVERY") or "10")
FLUSH_S = float(os.environ.get("BPROF_WATCH_FLUSH_S", "2.0"))


class WatchLog:
    """One rank's ring of iteration rows; `boundary()` is called once per iteration."""

    def __init__(self, run_dir: Path, rank: int, host: str, attempt: int = 0, clock_shift_ns: int = 0,
                 flush_every: int = FLUSH_EVERY, flush_s: float = FLUSH_S):
        self.folder = run_dir / "watch" / (f"rank{rank}" + (f".restart{attempt}" if attempt else ""))
        self.rank, self.host, self.attempt = rank, host, attempt
        self.clock_shift_ns = clock_shift_ns
        self.flush_every, self.flush_s = flush_every, flush_s
        self.rows: dict[str, list] = {name: [] for name in ROW_COLUMNS}
        self.groups: dict[str, list] = {name: [] for name in GROUP_COLUMNS}
        self.last_iteration: int | None = None
        self.last_ns = 0
        self.last_cpu_ns = 0
        self.last_flush_ns = time.monotonic_ns()
        self.data_wait_ns = 0
        self.data_idle_ns = 0
        self.gc_ns = 0
        self.blocked_ns: dict[tuple[str, str], list[int]] = {}  # (group name, desc) -> [ns, calls]
        self.blocked_total_ns = 0  # every add_blocked ever, to take the Python waits out of backward's
        self._gc_start_ns = 0
        self.model_flops_per_step: float | None = None  # declared (bprof.set_model_flops or --model-flops)
        self.device_properties: dict | None = None  # a CUDA rank's device, as Kineto's deviceProperties say it
        self.lock = threading.Lock()  # the accumulators are bumped from the training thread and DataLoader's

    # -- sources -----------------------------------------------------------------------------
    def install(self) -> None:
        # pyarrow takes 0.3 s to import (1 s under load): in a thread now, not inside the step that
        # first flushes, which would otherwise pay it
        threading.Thread(target=_import_pyarrow, name="bprof-watch-import", daemon=True).start()
        gc.callbacks.append(self._on_gc)
        _wrap_data_loader(self)
        _wrap_collectives(self)
        _wrap_backward(self)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start_ns = time.perf_counter_ns()
        elif self._gc_start_ns:
            self.gc_ns += time.perf_counter_ns() - self._gc_start_ns
            self._gc_start_ns = 0

    def add_data_wait(self, ns: int, cpu_ns: int) -> None:
        self.data_wait_ns += ns
        self.data_idle_ns += max(ns - cpu_ns, 0)

    def add_blocked(self, group: tuple[str, str], ns: int) -> None:
        with self.lock:
            acc = self.blocked_ns.setdefault(group, [0, 0])
            acc[0] += ns
            acc[1] += 1
            self.blocked_total_ns += ns

    # -- rows --------------------------------------------------------------------------------
    def boundary(self, iteration: int, windowed: bool) -> None:
        """Iteration `iteration` starts now; the row of the one before it is complete. `windowed`:
        a trace window was open during the iteration that ended (its profiler cost is in the row)."""
        now_ns, cpu_ns = time.time_ns(), time.thread_time_ns()
        if self.last_iteration is not None:
            with self.lock:
                blocked, self.blocked_ns = self.blocked_ns, {}
            row = self.rows
            row["iteration"].append(self.last_iteration)
            row["start_ns"].append(self.last_ns + self.clock_shift_ns)
            row["end_ns"].append(now_ns + self.clock_shift_ns)
            row["step_ns"].append(now_ns - self.last_ns)
            row["busy_ns"].append(cpu_ns - self.last_cpu_ns)
            row["data_wait_ns"].append(self.data_wait_ns)
            row["data_idle_ns"].append(self.data_idle_ns)
            row["gc_ns"].append(self.gc_ns)
            row["blocked_ns"].append(sum(ns for ns, _ in blocked.values()))
            row["windowed"].append(windowed)
            for (name, desc), (ns, calls) in blocked.items():
                for column, value in zip(GROUP_COLUMNS, (self.last_iteration, name, desc, ns, calls)):
                    self.groups[column].append(value)
        self.last_iteration, self.last_ns, self.last_cpu_ns = iteration, now_ns, cpu_ns
        self.data_wait_ns = self.data_idle_ns = self.gc_ns = 0
        if len(self.rows["iteration"]) >= self.flush_every or (
                self.rows["iteration"] and time.monotonic_ns() - self.last_flush_ns >= self.flush_s * 1e9):
            self.flush()

    def flush(self) -> None:
        """Write the ring's rows as one Parquet file (and its groups' rows beside it), then empty it."""
        if not self.rows["iteration"]:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.folder.mkdir(parents=True, exist_ok=True)
        first = self.rows["iteration"][0]
        table = pa.table({name: pa.array(values, type=_arrow_type(name)) for name, values in self.rows.items()})
        if self.device_properties is None:
            self.device_properties = _device_properties()
        meta = {b"bprof_watch": json.dumps({"rank": self.rank, "host": self.host, "attempt": self.attempt,
                                            "model_flops_per_step": self.model_flops_per_step,
                                            "device_properties": self.device_properties or None}).encode()}
        _write_atomic(pq, table.replace_schema_metadata(meta), self.folder / f"{first:09d}.steps.parquet")
        if self.groups["iteration"]:
            groups = pa.table({name: pa.array(v, type=_arrow_type(name)) for name, v in self.groups.items()})
            _write_atomic(pq, groups, self.folder / f"{first:09d}.groups.parquet")
        self.rows = {name: [] for name in ROW_COLUMNS}
        self.groups = {name: [] for name in GROUP_COLUMNS}
        self.last_flush_ns = time.monotonic_ns()


ROW_COLUMNS = ("iteration", "start_ns", "end_ns", "step_ns", "busy_ns", "data_wait_ns", "data_idle_ns", "gc_ns",
               "blocked_ns", "windowed")
GROUP_COLUMNS = ("iteration", "pg_name", "pg_desc", "blocked_ns", "calls")


def _arrow_type(name: str):
    import pyarrow as pa

    return {"windowed": pa.bool_(), "pg_name": pa.string(), "pg_desc": pa.string()}.get(name, pa.int64())


def _import_pyarrow() -> None:
    try:
        import pyarrow.parquet  # noqa: F401
    except Exception:  # the first flush says what is wrong
        pass


def _device_properties() -> dict:
    """The rank's CUDA device in Kineto's deviceProperties keys (what bprof.kernels.devices matches);
    {} on a CPU rank or before the script initialised CUDA (bprof never initialises it)."""
    try:
        import torch

        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return {}
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {"name": props.name, "computeMajor": props.major, "computeMinor": props.minor,
                "numSms": props.multi_processor_count, "totalGlobalMem": props.total_memory}
    except Exception:
        return {}


def _write_atomic(pq, table, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(path)


def _wrap_data_loader(log: WatchLog) -> None:
    """Time every DataLoader iterator's __next__: the wait for the next batch."""
    try:
        from torch.utils.data import dataloader
    except ImportError:
        return
    cls = dataloader._BaseDataLoaderIter
    original = cls.__next__
    if getattr(original, "_bprof_watch", False):
        return

    @functools.wraps(original)
    def __next__(self):
        t0, cpu0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return original(self)
        finally:
            log.add_data_wait(time.perf_counter_ns() - t0, time.thread_time_ns() - cpu0)

    __next__._bprof_watch = True
    cls.__next__ = __next__


def _wrap_collectives(log: WatchLog) -> None:
    """Time synchronous torch.distributed collectives and every async Work's wait()."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    import torch.distributed.distributed_c10d as c10d

    for name in _COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "_bprof_watch", False):
            continue
        wrapped = _timed_collective(original, log)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)
    work = c10d.Work
    if not getattr(work.wait, "_bprof_watch", False):
        original_wait = work.wait

        def wait(self, *args, **kwargs):
            if getattr(_inside, "collective", False):  # a synchronous call's own wait: timed by its wrapper
                return original_wait(self, *args, **kwargs)
            t0 = time.perf_counter_ns()
            try:
                return original_wait(self, *args, **kwargs)
            finally:
                log.add_blocked(("async", "Work.wait"), time.perf_counter_ns() - t0)

        wait._bprof_watch = True
        work.wait = wait


_inside = threading.local()  # .collective / .backward: a synchronous collective's wrapper / backward runs on this thread


def _timed_collective(fn, log: WatchLog):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if kwargs.get("async_op"):
            return fn(*args, **kwargs)  # its wait() is timed instead
        t0 = time.perf_counter_ns()
        _inside.collective = True
        try:
            return fn(*args, **kwargs)
        finally:
            _inside.collective = False
            elapsed = time.perf_counter_ns() - t0
            try:
                log.add_blocked(_group_of(kwargs.get("group")), elapsed)
            except Exception:  # bookkeeping must never break the user's collective
                pass

    wrapper._bprof_watch = True
    return wrapper


_DDP_GROUPS: list[tuple[str, str]] = []  # the process groups of the DDP modules made so far, in order


def watch_ddp_modules() -> None:
    """Note the process group of every DistributedDataParallel module made from now on. Called when
    torch is imported (the model is built before the first step, where the WatchLog is made)."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return
    original = DistributedDataParallel.__init__
    if getattr(original, "_bprof_watch", False):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            group = _group_of(self.process_group)
            if group not in _DDP_GROUPS:
                _DDP_GROUPS.append(group)
        except Exception:  # bookkeeping must never break the user's model
            pass

    __init__._bprof_watch = True
    DistributedDataParallel.__init__ = __init__


def _wrap_backward(log: WatchLog) -> None:
    """Count a CPU rank's sleep inside torch.autograd.backward (Tensor.backward calls it) as blocked
    in its DDP module's process group, once the script has made one (the module docstring says why)."""
    import torch
    import torch.autograd

    original = torch.autograd.backward
    if getattr(original, "_bprof_watch", False):
        return

    @functools.wraps(original)
    def backward(*args, **kwargs):
        if not _DDP_GROUPS or getattr(_inside, "backward", False) or torch.cuda.is_initialized():
            return original(*args, **kwargs)  # a nested backward (reentrant checkpointing) is in the outer one
        t0, cpu0, python0 = time.perf_counter_ns(), time.thread_time_ns(), log.blocked_total_ns
        _inside.backward = True
        try:
            return original(*args, **kwargs)
        finally:
            _inside.backward = False
            asleep_ns = (time.perf_counter_ns() - t0) - (time.thread_time_ns() - cpu0)
            asleep_ns -= log.blocked_total_ns - python0  # Python's own waits (FSDP's, a hook's) are counted already
            if asleep_ns > 0:
                log.add_blocked(_DDP_GROUPS[0], asleep_ns)

    backward._bprof_watch = True
    torch.autograd.backward = backward


def _group_of(group) -> tuple[str, str]:
    import torch.distributed as dist

    group = group if group is not None else dist.group.WORLD
    name = getattr(group, "group_name", None) or dist.distributed_c10d._get_process_group_name(group)
    return str(name), str(getattr(group, "group_desc", "") or "")
