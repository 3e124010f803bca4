"""Where the tasks run: `local` (this process for one task or one worker, else a pool of worker
processes) or `ray` (one Ray task per trace, on the cluster at --address or on a local Ray started
for the call). Both yield each TaskResult as it finishes, so the driver writes it at once and a
later failure cannot lose it; a worker that dies is a failed result naming its trace."""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from bprof.errors import UsageError
from bprof.scale.tasks import ReduceTask, TaskResult, naming, run_task

ENGINES = ("local", "ray")


def run_tasks(tasks: list[ReduceTask], engine: str = "local", *, workers: int | None = None,
              address: str | None = None) -> Iterator[TaskResult]:
    """Run every task; `workers` caps how many run at once (default: every CPU the engine has)."""
    check_engine(engine, workers, address)
    if not tasks:
        return iter(())
    return _local(tasks, workers) if engine == "local" else _ray(tasks, workers, address)


def check_engine(engine: str, workers: int | None, address: str | None) -> None:
    """The engine flags make sense together (a usage error otherwise), before any work starts."""
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if address is not None and engine != "ray":
        raise UsageError("--address names a Ray cluster: it needs --engine ray")
    if workers is not None and workers < 1:
        raise UsageError(f"--workers {workers}: at least 1")
    if engine == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UsageError("--engine ray needs Ray: pip install 'bprof[ray]'") from None


def _local(tasks: list[ReduceTask], workers: int | None) -> Iterator[TaskResult]:
    workers = min(workers or os.cpu_count() or 1, len(tasks))
    if workers == 1:  # in this process: no pool to start (and memory:// URLs stay visible)
        for task in tasks:
            yield run_task(task)
        return
    # spawn, not fork: the driver may hold DuckDB threads, which a forked child would inherit locked
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending = {pool.submit(run_task, t): t for t in tasks}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                task = pending.pop(future)
                try:
                    yield future.result()
                except Exception as exc:  # noqa: BLE001 - the worker process died (killed, out of memory)
                    yield TaskResult(task.trace, error=naming(task.trace, f"its worker process died ({type(exc).__name__}: {exc})"))


def _ray(tasks: list[ReduceTask], workers: int | None, address: str | None) -> Iterator[TaskResult]:
    import ray

    started = not ray.is_initialized()
    if started:
        try:
            # address None: RAY_ADDRESS if set, else a local Ray for this call (with `workers` CPUs)
            local = address is None and not os.environ.get("RAY_ADDRESS")  # a cluster of our own: we size it
            ray.init(address=address, num_cpus=workers if local else None, include_dashboard=False,
                     logging_level=logging.WARNING, log_to_driver=False, configure_logging=True)
        except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError...: one line
            raise UsageError(f"cannot start or reach Ray{f' at {address}' if address else ''} "
                             f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''})") from None
    try:
        remote = ray.remote(num_cpus=1, max_retries=1)(run_task)
        limit = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        queue, pending = list(reversed(tasks)), {}
        while queue or pending:
            while queue and len(pending) < limit:  # at most `limit` in flight: results come back as they finish
                task = queue.pop()
                pending[remote.remote(task)] = task
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                task = pending.pop(ref)
                try:
                    yield ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - the task's worker died or its node went away
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    yield TaskResult(task.trace, error=naming(task.trace, f"the Ray task failed ({type(exc).__name__}: {first})"))
    finally:
        if started:
            ray.shutdown()
