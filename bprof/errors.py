"""The one error hierarchy of bprof; the CLI turns each class into an exit code and one line."""


class BprofError(Exception):
    """Base class: a failure the user can act on, reported as one line."""

    exit_code = 1


class UsageError(BprofError):
    """A wrong flag, a missing run, a path that does not exist (exit 2)."""

    exit_code = 2


class DataError(BprofError):
    """A trace or store the user gave us is malformed or inconsistent (exit 3)."""

    exit_code = 3


class DeviceError(BprofError):
    """The hardware needed for capture or replay is missing or failed (exit 4)."""

    exit_code = 4
