"""The recorder inside each training rank of `bprof record`.

Iterations are counted by torch's global optimizer-step hook (several optimizers in one
iteration count once: the iteration is the largest per-optimizer count) or by explicit
`bprof.step()` calls. Inside a step window torch.profiler records CPU (and, once the script has
initialised CUDA, GPU) activity with shapes; outside, the hook costs one integer compare per
optimizer step. At each window's end the rank writes:
  traces/iteration_<start>/rank<R>.json.gz   the Kineto trace (bprof metadata embedded)
  meta/iteration_<start>/rank<R>.fr.json     Flight Recorder entries of the window (group, seq)
  meta/rank<R>.json                          per-rank metadata, rewritten after every window
An elastic launcher's restart (torchrun --max-restarts) starts the ranks again from iteration 0
with TORCHELASTIC_RESTART_COUNT=k: attempt k>0 writes its windows as iteration_<start>.restart<k>
beside the earlier attempts' and keeps their entries in meta/rank<R>.json, where a window an
earlier attempt left unfinished is marked `cut_by_restart`.
  traces/iteration_<start>/rank<R>.reduced/  with --reduce: `bprof reduce` of the trace, made by a
                                             child process while training goes on
Configuration comes from the environment the launcher sets (see launcher.py).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from bprof.profiler import identity
from bprof.profiler.windows import Window, parse_windows, triggered_window

_recorder = None  # the process's Recorder, once installed
REDUCE_THREADS = 2  # DuckDB threads of a rank's reduce, which runs beside its training
REDUCE_TIMEOUT_S = float(os.environ.get("BPROF_REDUCE_TIMEOUT_S", "600"))  # at exit, per reduce still running


def install() -> None:
    """Called right after the script imports torch in every process of the job. A process without
    RANK learns its rank, or that it is none (a launcher, a helper), at its first step (identity.py)."""
    global _recorder
    if _recorder is not None or not os.environ.get("BPROF_RUN_DIR"):
        return
    _recorder = Recorder(Path(os.environ["BPROF_RUN_DIR"]), identity.from_launcher_env())
    _recorder.install()


def recorder():
    return _recorder


class Recorder:
    def __init__(self, run_dir: Path, who: identity.Identity | None | str = "env"):
        self.run_dir = run_dir
        if who == "env":  # the launcher's variables, else rank 0 of 1, now (install() passes None: decide later)
            who = identity.from_launcher_env() or identity.Identity(0, 1, 0, "single process")
        self.who = who  # None until the first step decides (identity.resolve)
        self.inert = False  # not a training rank: counts nothing, writes nothing
        self.rank, self.world_size, self.local_rank = (who.rank, who.world_size, who.local_rank) if who else (0, 1, 0)
        self.windows = list(parse_windows(os.environ.get("BPROF_STEPS", "3:6")))
        self.options = json.loads(os.environ.get("BPROF_OPTIONS", "{}"))
        self.run_id = os.environ.get("BPROF_RUN_ID", "")
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)  # torchrun's restarts so far
        self.earlier_kept = self.attempt == 0  # attempt k>0: earlier attempts' windows not yet read back
        self.host = os.environ.get("BPROF_HOSTNAME") or socket.gethostname()
        self.clock_shift_ns = int(os.environ.get("BPROF_TEST_CLOCK_SHIFT_NS", "0"))  # tests only
        self.iteration = 0
        self.explicit_steps = False
        self.counts: dict[int, int] = {}
        self.prof = None
        self.window: Window | None = None
        self.window_t0_ns = 0
        self.captured: list[dict] = []
        self.clock_samples: list[dict] = []
        self.notes: list[str] = []
        self.model: dict = {}
        self.trigger_mtime = None
        self.run_id_shared = False
        self._gc_ranges: list = []
        self._reducing: list = []  # (trace, Popen) of --reduce children not yet waited for
        self._previous_sigterm = None
        self._stopping = False
        self._pending_signal = None
        self.watch = None  # bprof record --watch: the WatchLog, made at the first step (it needs the rank)
        self.trigger_reasons: dict[Window, str] = {}  # windows asked for by a trigger, and why

    # -- iteration detection -------------------------------------------------------------
    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from bprof.profiler.p2p import P2PLog

        self.handle = register_optimizer_step_post_hook(self._on_optimizer_step)
        self.p2p = P2PLog(self.rank if self.who else None)  # None: the process group's rank, at each call
        self.p2p.install()
        if os.environ.get("BPROF_WATCH"):  # the model is made before the first step, where the watch starts
            from bprof.profiler.watch_rank import watch_ddp_modules

            watch_ddp_modules()
        if self.who is not None:
            self._watch_hangs()
        atexit.register(self.close)  # metadata is written once a window starts or is declined

    def _watch_hangs(self) -> None:
        if os.environ.get("BPROF_HANG_TIMEOUT_S"):  # bprof record --hang-timeout: heartbeat, dumps on request
            from bprof.profiler import hang_watch

            hang_watch.install(self.run_dir, self.rank)

    def _decide_identity(self) -> bool:
        """At the first step of a process that had no RANK at import: whether it is a rank to record."""
        who = identity.resolve(self.run_dir)
        if who is None:
            self.inert = True
            return False  # the hook stays (torch is iterating its hooks now): one flag test a step
        self.who = who
        self.rank, self.world_size, self.local_rank = who.rank, who.world_size, who.local_rank
        if who.source != "RANK":
            self.notes.append(f"rank {who.rank} of {who.world_size} from {who.source} (no RANK at import torch)")
        if self.explicit_steps:  # bprof.step(): outside torch's hooks
            self._watch_hangs()
        else:
            self._watch_hangs_at_next_step()
        return True

    def _watch_hangs_at_next_step(self) -> None:
        """hang_watch registers an optimizer post-hook, which torch forbids while it runs them (as
        now: this step's post-hook decided the rank), so it starts from a pre-hook of the next step;
        the pre-hook then stays, one flag test a step (removing it there is forbidden too)."""
        if not os.environ.get("BPROF_HANG_TIMEOUT_S"):
            return
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        started = []

        def start(optimizer, args, kwargs):
            if not started:
                started.append(True)
                self._watch_hangs()

        register_optimizer_step_pre_hook(start)

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self.explicit_steps or self.inert:
            return
        key = id(optimizer)
        self.counts[key] = self.counts.get(key, 0) + 1
        done = max(self.counts.values())
        if done > self.iteration:
            self.boundary(done)

    def explicit_step(self) -> None:
        self.explicit_steps = True
        self.boundary(self.iteration + 1)

    def boundary(self, iteration: int) -> None:
        """Iteration `iteration` (0-based) is about to start."""
        if self.inert or (self.who is None and not self._decide_identity()):
            return
        self.iteration = iteration
        if os.environ.get("BPROF_WATCH"):
            self._watch_boundary(iteration)
        self._check_trigger()
        stopped = False
        if self.prof is not None:
            if iteration >= self.window.end:
                self._stop()
                stopped = True
            else:
                self.prof.step()
                return
        while self.windows and self.windows[0].end <= iteration:
            self.notes.append(f"window {self.windows.pop(0)} was already past when bprof saw it")
        if self.windows and self.windows[0].start <= iteration:
            window = self.windows.pop(0)
            if window.start < iteration:  # e.g. 0:3, since the first boundary bprof sees is iteration 1
                self.notes.append(f"window {window} started late, at iteration {iteration}")
                window = Window(iteration, window.end)
            if stopped and _start_when_optimizer_step_returns(lambda: self._start(window)):
                return
            self._start(window)

    def _watch_boundary(self, iteration: int) -> None:
        if self.watch is None:
            from bprof.profiler.watch_rank import WatchLog

            self.watch = WatchLog(self.run_dir, self.rank, self.host, self.attempt, self.clock_shift_ns)
            self.watch.install()
        self.watch.model_flops_per_step = (self.model or _declared_model_flops(self.options)).get("model_flops_per_step")
        self.watch.boundary(iteration, windowed=self.prof is not None)

    def _check_trigger(self) -> None:
        trigger = self.run_dir / "trigger"
        try:
            mtime = trigger.stat().st_mtime_ns
        except OSError:
            return
        if mtime == self.trigger_mtime:
            return
        self.trigger_mtime = mtime
        try:
            text = trigger.read_text().strip() or "3"
        except OSError:
            text = "3"
        window, reason = _asked_window(text, self.iteration)
        if window.end <= self.iteration:
            self.notes.append(f"triggered window {window} was already past when rank {self.rank} saw it")
            return
        if all(w.end <= window.start or w.start >= window.end for w in self.windows) and not (
                self.prof is not None and window.start < self.window.end):
            self.windows = sorted([*self.windows, window])
            if reason:
                self.trigger_reasons[window] = reason

    # -- windows ---------------------------------------------------------------------------
    def _start(self, window: Window) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        if torch.autograd.profiler._is_profiler_enabled:
            self.notes.append(f"window {window}: the script runs its own torch.profiler; bprof stepped aside")
            print(f"bprof: rank {self.rank}: the script runs its own torch.profiler; bprof steps aside "
                  f"for window {window}", file=sys.stderr)
            self._write_meta()
            return
        self._share_run_id()
        self._clock_sync(f"start:{window}")
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()  # never initialise CUDA ourselves
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        kwargs = {}
        if cuda:
            kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
        if self.options.get("execution_trace"):
            from torch.profiler import ExecutionTraceObserver

            et_path = self._path("traces", window, "et.json")
            kwargs["execution_trace_observer"] = ExecutionTraceObserver().register_callback(str(et_path))
        prof = profile(activities=activities, record_shapes=True, profile_memory=bool(self.options.get("memory")),
                       with_stack=False, **kwargs)
        prof.preset_metadata_json("bprof", json.dumps(self._trace_meta()))
        prof.step_num = window.start  # ProfilerStep#N carries the iteration number
        prof.record_steps = True  # without a schedule torch would not write ProfilerStep ranges
        self.window, self.window_t0_ns = window, time.time_ns()
        gc.callbacks.append(self._on_gc)
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        self.p2p.entries, self.p2p.recording = [], True
        prof.start()
        self.prof = prof

    def _stop(self, partial: bool = False) -> None:
        prof, window = self.prof, self.window
        self.prof = None
        self._stopping = True
        try:
            self._finish_window(prof, window, partial)
        finally:
            self._stopping = False
            if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._previous_sigterm)
                self._previous_sigterm = None
            if self._pending_signal is not None:  # a SIGTERM came while the trace was being written
                signal.signal(self._pending_signal, signal.SIG_DFL)
                os.kill(os.getpid(), self._pending_signal)

    def _finish_window(self, prof, window: Window, partial: bool) -> None:
        prof.stop()
        observer = getattr(prof, "execution_trace_observer", None)
        if observer is not None:  # the file is closed (its JSON completed) only here, or at exit, which os._exit skips
            observer.unregister_callback()
            _gzip_in_place(Path(observer.get_output_file_path()))
        self.p2p.recording = False
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        t1_ns = time.time_ns()
        if not partial:  # a dying job cannot be asked for ping-pongs
            self._clock_sync(f"end:{window}")
        trace = self._path("traces", window, "json.gz")
        _export_gzip(prof, trace, self.rank)
        if self.clock_shift_ns:
            _shift_trace_clock(trace, self.clock_shift_ns)
        num_fr = self._dump_flight_recorder(window, self.window_t0_ns, t1_ns)
        self.captured.append({"window": str(window), "trace": str(trace.relative_to(self.run_dir)),
                              "t0_ns": self.window_t0_ns + self.clock_shift_ns,
                              "t1_ns": t1_ns + self.clock_shift_ns, "partial": partial,
                              "flight_recorder_entries": num_fr, "attempt": self.attempt}
                             | ({"cut_at_iteration": self.iteration} if partial else {})
                             | ({"trigger": self.trigger_reasons[window]} if window in self.trigger_reasons else {}))
        self._write_meta()
        if self.options.get("reduce") and not partial:  # a dying rank has no time to wait for it
            self._start_reduce(trace)

    def close(self) -> None:
        """At exit: a window still open is written as a partial window; --reduce children are waited for;
        --watch's last rows are flushed."""
        if self.watch is not None:
            self.watch.flush()
        if self.prof is not None:
            self.notes.append(f"window {self.window} ended early (the script stopped at iteration {self.iteration})")
            self._stop(partial=True)
        if self._reducing:
            self._wait_reduces()
            self._write_meta()

    # -- bprof record --reduce ----------------------------------------------------------------
    def _start_reduce(self, trace: Path) -> None:
        """Reduce the window's trace beside it in a child process: training goes on meanwhile, and a
        failing reduce cannot harm the rank or its trace."""
        import subprocess

        env = {k: v for k, v in os.environ.items() if k != "BPROF_RUN_DIR"}  # keeps bprof's hook inert there
        cmd = [os.environ.get("BPROF_PYTHON") or sys.executable, "-m", "bprof.cli.main", "reduce", str(trace),
               "--threads", str(REDUCE_THREADS)]
        try:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
        except OSError as exc:
            self._reduce_failed(trace, f"{type(exc).__name__}: {exc}")
            return
        self._reducing.append((trace, proc))

    def _wait_reduces(self) -> None:
        import subprocess

        for trace, proc in self._reducing:
            try:
                _, err = proc.communicate(timeout=REDUCE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                self._reduce_failed(trace, f"still running after {REDUCE_TIMEOUT_S:.0f} s, stopped")
                continue
            if proc.returncode != 0:
                lines = [ln for ln in (err or "").strip().splitlines() if ln.strip()]
                self._reduce_failed(trace, lines[-1] if lines else f"exit code {proc.returncode}")
        self._reducing = []

    def _reduce_failed(self, trace: Path, why: str) -> None:
        note = (f"bprof reduce of {trace.name} failed ({why}); the trace is complete, reduce it by hand: "
                f"bprof reduce {trace}")
        self.notes.append(note)
        print(f"bprof: rank {self.rank}: warning: {note}", file=sys.stderr)

    def _on_sigterm(self, signum, frame) -> None:
        """The launcher stops the survivors when a peer dies: keep their open window, then die as asked."""
        if self._stopping:  # the window is being written (at exit, say): die once it is
            self._pending_signal = signum
            return
        try:
            self.close()
        finally:
            signal.signal(signum, self._previous_sigterm or signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _on_gc(self, phase: str, info: dict) -> None:
        """Python GC pauses as `bprof/gc.gen<N>` ranges in the trace (a straggler cause at scale)."""
        from torch.profiler import record_function

        if phase == "start":
            rf = record_function(f"bprof/gc.gen{info.get('generation', '?')}")
            rf.__enter__()
            self._gc_ranges.append(rf)
        elif self._gc_ranges:
            self._gc_ranges.pop().__exit__(None, None, None)

    def _dump_flight_recorder(self, window: Window, t0_ns: int, t1_ns: int) -> int:
        """Flight Recorder entries created in the window: group, per-group seq, op, sizes, dtypes."""
        try:
            import torch

            dump = json.loads(torch._C._distributed_c10d._dump_fr_trace_json())
        except Exception as exc:  # Flight Recorder off (TORCH_FR_BUFFER_SIZE unset) or unavailable
            self.notes.append(f"no Flight Recorder entries: {type(exc).__name__}: {exc}")
            dump = {}
        entries = [e for e in dump.get("entries", []) if t0_ns <= e.get("time_created_ns", 0) <= t1_ns]
        entries += self.p2p.entries
        for e in entries:
            e["time_created_ns"] += self.clock_shift_ns
            if "time_done_ns" in e:
                e["time_done_ns"] += self.clock_shift_ns
        path = self._path("meta", window, "fr.json")
        path.write_text(json.dumps({"version": dump.get("version"), "entries": entries}))
        return len(entries)

    def _clock_sync(self, phase: str) -> None:
        from bprof.profiler import clock_sync

        try:
            samples = clock_sync.exchange(phase, self.rank, self.world_size, self.clock_shift_ns)
        except Exception as exc:
            self.notes.append(f"clock sync {phase} failed: {type(exc).__name__}: {exc}")
            return
        if samples:
            self.clock_samples.append({"phase": phase, "reference_rank": 0, "samples": samples})

    # -- metadata --------------------------------------------------------------------------
    def _share_run_id(self) -> None:
        """Every host's launcher made its own id; the job takes rank 0's, via the job's store."""
        if self.run_id_shared:
            return
        self.run_id_shared = True
        try:
            import torch.distributed as dist

            if not dist.is_initialized():
                return
            store = dist.distributed_c10d._get_default_store()
            if self.rank == 0:
                store.set("bprof/run_id", self.run_id)
            else:
                self.run_id = store.get("bprof/run_id").decode()
        except Exception as exc:
            self.notes.append(f"run id not shared through the store: {exc}")

    def _trace_meta(self) -> dict:
        return {"run_id": self.run_id, "rank": self.rank, "local_rank": self.local_rank,
                "world_size": self.world_size, "host": self.host, "attempt": self.attempt}

    def _keep_earlier_attempts(self) -> None:
        """A restarted rank (attempt k>0) keeps what the earlier attempts of its rank captured; a
        window one of them left unfinished was cut by the restart that started this attempt."""
        self.earlier_kept = True
        try:
            earlier = json.loads((self.run_dir / "meta" / f"rank{self.rank}.json").read_text())
        except (OSError, ValueError):
            earlier = {}
        captured = [w for w in earlier.get("windows_captured") or [] if w.get("attempt", 0) < self.attempt]
        for w in captured:
            if w.get("partial") and "cut_by_restart" not in w:
                w["cut_by_restart"] = self.attempt
                self.notes.append(f"window {w['window']} of attempt {w.get('attempt', 0)} was cut at iteration "
                                  f"{w.get('cut_at_iteration', '?')} by the launcher's restart {self.attempt}")
        self.captured[:0] = captured
        self.notes[:0] = [n for n in earlier.get("notes") or [] if n not in self.notes]

    def _write_meta(self) -> None:
        if not self.earlier_kept:
            self._keep_earlier_attempts()
        meta = self._trace_meta() | {
            "pid": os.getpid(),
            "command": json.loads(os.environ.get("BPROF_COMMAND", "null")),
            "git_sha": os.environ.get("BPROF_GIT_SHA") or None,
            "git_branch": os.environ.get("BPROF_GIT_BRANCH") or None,
            "windows_requested": os.environ.get("BPROF_STEPS", ""),
            "windows_captured": self.captured,
            "notes": self.notes,
            "model": self.model or _declared_model_flops(self.options),
            "clock_sync": self.clock_samples,
        } | _environment_facts()
        path = self.run_dir / "meta" / f"rank{self.rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=1, default=str))
        tmp.replace(path)

    def _path(self, kind: str, window: Window, suffix: str) -> Path:
        folder = f"iteration_{window.start}" + (f".restart{self.attempt}" if self.attempt else "")
        path = self.run_dir / kind / folder / f"rank{self.rank}.{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


def _asked_window(text: str, seen_at: int) -> tuple[Window, str | None]:
    """The trigger file's window: a step count (SIGUSR1: the next aligned iteration) or, from
    --watch, JSON naming the start iteration, the step count and the reason."""
    try:
        asked = json.loads(text)
    except ValueError:
        asked = 3
    if isinstance(asked, dict):
        steps = int(asked.get("steps") or 3)
        start = int(asked.get("start") or triggered_window(seen_at, steps).start)
        return Window(start, start + steps), asked.get("reason")
    return triggered_window(seen_at, int(asked) if isinstance(asked, int) and asked > 0 else 3), None


def _start_when_optimizer_step_returns(start) -> bool:
    """Call `start()` once the optimizer step whose hook runs now has returned; False (nothing done)
    when no optimizer step is on the stack (an explicit bprof.step()).

    Why: the step hooks run inside the `Optimizer.step#...` range of torch's wrapper. Two adjacent
    windows (2:4,4:6) stopped one profiler session and started the next inside it, so the range begun
    under the first ended under the second, and the process died in the garbage collector at the
    second window's end (a segfault in 3 of 3 runs of a 2-rank DDP toy; windows with an iteration
    between them never crashed). Python's profile hook sees the wrapper's frame return, after the
    range closed; it is the previous profile function's again right after."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "wrapper"
                                     and frame.f_code.co_filename.replace(os.sep, "/").endswith("torch/optim/optimizer.py")):
        frame = frame.f_back
    if frame is None:
        return False
    step_frame, previous = frame, sys.getprofile()

    def on_event(f, event, arg):
        if previous is not None:
            previous(f, event, arg)
        if f is step_frame and event == "return":
            sys.setprofile(previous)
            start()

    sys.setprofile(on_event)
    return True


def _export_gzip(prof, trace: Path, rank: int) -> None:
    """Export plain JSON, then gzip it at level 1: torch's own .gz export compresses at level 9,
    about 10x slower (1.13 s against 0.12 s for a 13 MB trace) for files 1.7x smaller. Written
    under temporary names and renamed, so a killed rank never leaves a half-written trace."""
    import gzip
    import shutil

    plain = trace.with_name(f"rank{rank}.tmp.json")
    packed = trace.with_name(f"rank{rank}.tmp.json.gz")
    prof.export_chrome_trace(str(plain))
    with plain.open("rb") as src, gzip.open(packed, "wb", compresslevel=1) as dst:
        shutil.copyfileobj(src, dst, 4 << 20)
    packed.replace(trace)
    plain.unlink()


def _gzip_in_place(path: Path) -> None:
    """path -> path.gz at level 1 (an execution trace: 17.5 MB per rank for 3 steps of train_gpt,
    1.1 MB packed), written under a temporary name and renamed, then the plain file removed."""
    import gzip
    import shutil

    if not path.is_file():
        return
    packed = path.with_name(path.name.replace(".json", ".tmp.json") + ".gz")
    with path.open("rb") as src, gzip.open(packed, "wb", compresslevel=1) as dst:
        shutil.copyfileobj(src, dst, 4 << 20)
    packed.replace(path.with_name(path.name + ".gz"))
    path.unlink()


def _declared_model_flops(options: dict) -> dict:
    flops = options.get("model_flops")
    return {"model_flops_per_step": float(flops)} if flops else {}


def _environment_facts() -> dict:
    import torch

    facts = {"torch_version": torch.__version__, "cuda_version": torch.version.cuda,
             "intra_op_threads": torch.get_num_threads(), "device_name": "cpu", "device_properties": None}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        facts |= {"device_name": props.name, "device_index": index,
                  "device_properties": {"total_memory_bytes": props.total_memory,
                                        "multi_processor_count": props.multi_processor_count,
                                        "major": props.major, "minor": props.minor}}
        try:
            facts["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            facts["nccl_version"] = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            facts["backend"] = dist.get_backend()
            facts["process_groups"] = [
                {"pg_name": c.get("pg_name"), "pg_desc": c.get("pg_desc"), "ranks": c.get("ranks")}
                for c in dist.distributed_c10d._get_all_pg_configs()]
    except Exception as exc:
        facts["process_groups_error"] = str(exc)
    return facts


def _shift_trace_clock(path: Path, shift_ns: int) -> None:
    """Tests only: move a trace's clock by shift_ns, as if its host's clock were off."""
    import gzip

    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    trace["baseTimeNanoseconds"] = trace.get("baseTimeNanoseconds", 0) + shift_ns
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
