"""Step windows: which training iterations a capture profiles (half-open ranges, `10:15,5000:5005`)."""

from __future__ import annotations

from dataclasses import dataclass

from bprof.errors import UsageError

DEFAULT_WINDOWS = "3:6"  # a short window after a few warm-up iterations
TRIGGER_ALIGN = 8  # on-demand windows start at the next multiple of this, so ranks agree


@dataclass(frozen=True, order=True)
class Window:
    start: int
    end: int  # exclusive

    def __str__(self) -> str:
        return f"{self.start}:{self.end}"


def parse_windows(text: str) -> tuple[Window, ...]:
    """`10:15,5000:5005` -> windows, sorted; overlapping or empty windows are a usage error."""
    windows = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            start_text, end_text = part.split(":")
            window = Window(int(start_text), int(end_text))
        except ValueError:
            raise UsageError(f"--steps {text!r}: {part!r} is not START:END (half-open, e.g. 10:15)") from None
        if window.start < 0 or window.end <= window.start:
            raise UsageError(f"--steps {text!r}: window {part!r} is empty or negative")
        windows.append(window)
    if not windows:
        raise UsageError(f"--steps {text!r}: no window given")
    windows.sort()
    for a, b in zip(windows, windows[1:]):
        if b.start < a.end:
            raise UsageError(f"--steps {text!r}: windows {a} and {b} overlap")
    return tuple(windows)


def triggered_window(seen_at: int, num_steps: int) -> Window:
    """The window an on-demand trigger noticed after iteration `seen_at` captures."""
    start = (seen_at // TRIGGER_ALIGN + 1) * TRIGGER_ALIGN
    return Window(start, start + num_steps)
