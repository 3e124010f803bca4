"""The record process's watch thread: poll the ranks' watch files, say what changes, serve metrics."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from pathlib import Path

from bprof.watch.live import LiveWatch, WatchOptions

STATUS_EVERY_S = 10.0  # a status line at most this often while nothing happens


class WatchThread:
    def __init__(self, run_dir: Path, options: WatchOptions, metrics_port: int | None = None,
                 metrics_addr: str = "0.0.0.0", model_flops_per_step: float | None = None, out=None):
        self.out = out or sys.stderr
        if model_flops_per_step is not None:
            options = dataclasses.replace(options, model_flops_per_step=model_flops_per_step)
        self.live = LiveWatch(run_dir, options)
        self.metrics_port, self.metrics_addr = metrics_port, metrics_addr
        self.server = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="bprof-watch", daemon=True)
        self.error: str | None = None

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def start(self) -> None:
        if self.metrics_port is not None:
            from bprof.watch.metrics import serve

            self.server, _ = serve(self.live.snapshot, self.metrics_port, self.metrics_addr)
            self._say(f"bprof watch: metrics at http://{self.metrics_addr}:{self.server.server_port}/metrics")
        self.thread.start()

    def _loop(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(self.live.options.poll_s):
            try:
                said = self.live.poll()
            except Exception as exc:  # the watch must never end the job it watches
                self.error = f"{type(exc).__name__}: {exc}"
                self._say(f"bprof watch: warning: the live analysis stopped: {self.error}")
                return
            for line in said:
                self._say(line)
            if said:
                last_status = time.monotonic()
            elif time.monotonic() - last_status >= STATUS_EVERY_S:
                line = self.live.status_line()
                if line:
                    self._say(line)
                last_status = time.monotonic()

    def stop(self) -> dict:
        """After the job: the last poll, live.json written, the endpoint closed; returns live.json's data."""
        self.stopping.set()
        self.thread.join(timeout=30)
        if self.error is None:
            for line in self.live.poll():
                self._say(line)
        self.live.save()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        from bprof.watch.files import read_live

        return read_live(self.live.run_dir)
