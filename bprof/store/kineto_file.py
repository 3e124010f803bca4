"""Split one Kineto trace file into its `traceEvents` array and its other top-level keys.

The array is streamed (gzip or plain) into work files that DuckDB's JSON reader scans natively:
a large array is cut at event boundaries into several valid arrays, so that DuckDB parses the
parts of one trace on several threads. The surrounding keys (`distributedInfo`, `deviceProperties`, `baseTimeNanoseconds`, ...) are
parsed with the stdlib. Memory stays bounded by the chunk size whatever the trace size.

A trace may be an fsspec URL (s3://, gs://, hdfs://, memory://; see trace_path): it is read as a
stream through fsspec like a local file, never downloaded first.

Format quirk: the metadata keys may come before or after `traceEvents` (modern traces put
`baseTimeNanoseconds` last), and some traces are pretty-printed, so nothing here relies on lines.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from bprof.errors import DataError, UsageError

CHUNK_BYTES = 4 << 20
PART_BYTES = 16 << 20
MAX_HEADER_BYTES = 256 << 20
TAIL_WINDOWS_BYTES = (1 << 20, 64 << 20)

_GZIP_MAGIC = b"\x1f\x8b"
# A `]` that may close the traceEvents array: it follows the last event's `}` (or `[` when the
# array is empty) and is followed by the next top-level key or by the object's closing brace.
_ARRAY_END_CANDIDATE = re.compile(rb'(?:\}|\[)\s*(\])\s*(?:,\s*"|\}\s*$)')
# Where one event ends and the next begins: `}` `,` `{` with a line break between them (a JSON
# string cannot hold a raw newline, so this is outside strings) and the next object opening with
# an event key. Nested objects in args never start with these keys. Traces without line breaks
# are simply not cut.
_EVENT_BOUNDARY = re.compile(rb'(\})[ \t\r]*(?:,[ \t\r]*\n|\n\s*,)\s*(\{)\s*"(?:ph|name|cat)"\s*:')


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(location) -> bool:
    """A string (or path object) naming a file through an fsspec protocol (s3://, file://, ...)."""
    return isinstance(location, str) and _URL.match(location) is not None or type(location).__module__.startswith("upath")


def trace_path(location):
    """A trace's location as a path object: a local path (or file:// URL) as pathlib.Path; any other
    fsspec URL as universal_pathlib's UPath, whose open() streams through fsspec. Path objects pass."""
    if not isinstance(location, str):
        return location
    if not _URL.match(location):
        return Path(location)
    if location.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(location).path))
    try:
        from upath import UPath
    except ImportError:
        raise UsageError(f"{location}: reading URLs needs fsspec and universal-pathlib "
                         "(pip install 'bprof[remote]')") from None
    try:
        path = UPath(location)
        path.fs  # the protocol's filesystem (s3fs, gcsfs, ...) is imported here: say which one is missing
    except (ImportError, ValueError) as exc:
        raise UsageError(f"{location}: fsspec cannot open this URL ({str(exc).splitlines()[0]})") from None
    return path


def trace_text(path) -> str:
    """How a reduced output's manifest names its trace: the resolved local path, or the URL."""
    return str(path.resolve()) if isinstance(path, Path) else str(path)


class NotATrace(DataError):
    """The file is a JSON object without a traceEvents key: a config or sidecar, not a trace."""


@dataclass(frozen=True)
class SplitTrace:
    """One trace file after splitting: its events as one or more JSON arrays, and its metadata."""

    path: Path
    array_paths: tuple[Path, ...]  # each a valid JSON array of events; together, all events in order
    part_offsets: tuple[int, ...]  # source offset (uncompressed) of byte 0 of each part file
    uncompressed_bytes: int
    compressed: bool
    metadata: dict  # every top-level key except traceEvents


def split_trace(path: Path, array_path: Path) -> SplitTrace:
    """Stream `path` into work files named after `array_path` and return the metadata.

    Raises DataError naming the file on truncated gzip, invalid JSON around the array, a
    missing traceEvents key (NotATrace when the whole object has none) or an empty event list.
    """
    path = trace_path(path)
    header = bytearray()
    header_meta: dict | None = None
    total = 0
    parts = _Parts(Path(array_path))
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None
    with raw, parts:
        compressed = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        chunks = _inflated_chunks(raw, path) if compressed else iter(lambda: raw.read(CHUNK_BYTES), b"")
        for data in chunks:
            total += len(data)
            if header_meta is not None:
                parts.write(data)
                continue
            header += data
            found = _scan_header(bytes(header), path, final=False)
            if found is not None:
                header_meta, array_offset = found
                parts.start(array_offset, bytes(header[array_offset:]))
                header = bytearray()
            elif len(header) > MAX_HEADER_BYTES:
                raise DataError(f"{path}: no traceEvents array in the first {MAX_HEADER_BYTES >> 20} MB")
        if header_meta is None:
            header_meta, array_offset = _scan_header(bytes(header), path, final=True)
            parts.start(array_offset, bytes(header[array_offset:]))
    last = parts.paths[-1]
    end, tail_meta = _find_array_end(last, last.stat().st_size, path, parts.offsets[0])
    with last.open("r+b") as out:
        out.truncate(end + 1)
    if _array_is_empty(parts.paths[0]):
        raise DataError(f"{path}: the trace has no events (traceEvents is empty)")
    return SplitTrace(path, tuple(parts.paths), tuple(parts.offsets), total, compressed,
                      {**header_meta, **tail_meta})


class _Parts:
    """Writes the events array into part files of about PART_BYTES, cut at event boundaries."""

    def __init__(self, base: Path):
        self.base = base
        self.paths: list[Path] = []
        self.offsets: list[int] = []
        self._out = None
        self._written = 0
        self._source_pos = 0  # source offset of the next byte given to write()

    def start(self, source_offset: int, data: bytes) -> None:
        self._open(source_offset)
        self._source_pos = source_offset
        self.write(data)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        at = 0  # bytes of data already written
        while True:
            cut = None
            if self._written + len(data) - at > PART_BYTES:
                cut = _EVENT_BOUNDARY.search(data, at + max(0, PART_BYTES - self._written))
            if cut is None:
                self._out.write(view[at:])
                self._written += len(data) - at
                break
            self._out.write(view[at:cut.end(1)])
            self._out.write(b"]")
            self._out.close()
            # the new part is `[` + the source from the next event's `{`: byte b <-> offset + b
            self._open(self._source_pos + cut.start(2) - 1, head=b"[")
            at = cut.start(2)
        self._source_pos += len(data)

    def _open(self, source_offset: int, head: bytes = b"") -> None:
        path = self.base if not self.paths else self.base.with_name(f"{self.base.stem}.part{len(self.paths)}{self.base.suffix}")
        self.paths.append(path)
        self.offsets.append(source_offset)
        self._out = path.open("wb")
        self._out.write(head)
        self._written = len(head)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self._out is not None:
            self._out.close()
        elif not self.paths:
            self.base.touch()  # nothing was written: an empty work file keeps the caller simple
            self.paths.append(self.base)
            self.offsets.append(0)


def _inflated_chunks(raw, path: Path):
    """Yield the decompressed bytes of a gzip file (every member) in pieces of at most CHUNK_BYTES."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    pending = b""
    started = False  # bytes of the current member fed to the inflater
    try:
        while True:
            if not pending:
                pending = raw.read(1 << 20)
                if not pending:
                    break
            started = True
            data = inflater.decompress(pending, CHUNK_BYTES)
            pending = inflater.unconsumed_tail
            if data:
                yield data
            if inflater.eof:  # a multi-member gzip goes on with the next member
                pending = inflater.unused_data + pending
                inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                started = False
                if not pending.strip(b"\0"):
                    pending = raw.read(1 << 20)
                    if not pending.strip(b"\0"):
                        return
        rest = inflater.flush()
    except zlib.error as exc:
        raise DataError(f"{path}: corrupt gzip data ({exc})") from None
    if rest:
        yield rest
    if started:
        raise DataError(f"{path}: truncated gzip stream (the file ends before the compressed data does)")


def _scan_header(buf: bytes, path: Path, final: bool) -> tuple[dict, int] | None:
    """Parse top-level keys up to the `[` of traceEvents; return (metadata, its byte offset).

    Returns None when `buf` ends before that point and more data may come (`final` False).
    """
    text = buf.decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    meta: dict = {}
    i = _skip_ws(text, 0)
    try:
        if i < len(text) and text[i] == "[":  # a bare Chrome-trace event array
            return meta, len(text[:i].encode())
        _expect(text, i, "{")
        i = _skip_ws(text, i + 1)
        while True:
            if text[i] == "}":
                raise NotATrace(f"{path}: no traceEvents array (not a Kineto/Chrome trace?)")
            key, i = decoder.raw_decode(text, i)
            i = _skip_ws(text, i)
            _expect(text, i, ":")
            i = _skip_ws(text, i + 1)
            if key == "traceEvents":
                _expect(text, i, "[")
                return meta, len(text[:i].encode())
            meta[key], i = decoder.raw_decode(text, i)
            i = _skip_ws(text, i)
            if text[i] == ",":
                i = _skip_ws(text, i + 1)
            else:
                _expect(text, i, "}")
    except (json.JSONDecodeError, IndexError, ValueError) as exc:
        if not final:
            return None
        pos = getattr(exc, "pos", None)
        where = f" at byte {len(text[:pos].encode())}" if pos is not None else ""
        if not buf.strip():
            raise DataError(f"{path}: the file is empty") from None
        raise DataError(f"{path}: invalid JSON{where} before the traceEvents array, or no traceEvents") from None


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _expect(text: str, i: int, char: str) -> None:
    if i >= len(text) or text[i] != char:
        raise ValueError(f"expected {char!r}")


def _find_array_end(array_path: Path, size: int, path: Path, array_offset: int) -> tuple[int, dict]:
    """Locate the `]` closing the events array in the work file; parse the keys after it.

    Algorithm: in a window at the file's end, try each candidate `]` and keep the leftmost one
    after which the rest parses as the remainder of a JSON object. A `]` inside the array can
    never qualify: its remainder still holds the array's own closing bracket.
    """
    with array_path.open("rb") as f:
        for window in TAIL_WINDOWS_BYTES:
            start = max(0, size - window)
            f.seek(start)
            tail = f.read()
            best: tuple[int, dict] | None = None
            for match in _ARRAY_END_CANDIDATE.finditer(tail):
                p = match.start(1)
                rest = tail[p + 1:]
                try:
                    extra = json.loads(b'{"_":0' + rest)
                except ValueError:
                    continue
                extra.pop("_")
                best = (start + p, extra)
                break  # candidates come left to right: the first that parses is the leftmost
            if best is not None:
                return best
            if start == 0:
                break
    raise DataError(
        f"{path}: truncated or malformed JSON: the traceEvents array starting at byte "
        f"{array_offset} is never closed"
    )


def _array_is_empty(array_path: Path) -> bool:
    with array_path.open("rb") as f:
        head = f.read(4096)
    return head[1:].lstrip()[:1] == b"]"
