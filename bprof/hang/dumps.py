"""Reading PyTorch Flight Recorder dumps (no torch needed).

A dump is what `torch._C._distributed_c10d._dump_fr_trace()` (pickle), `_dump_fr_trace_json()` /
`_dump_nccl_trace_json()` (JSON), or the NCCL watchdog (`TORCH_NCCL_DUMP_ON_TIMEOUT=1`, one file
per rank named `<TORCH_FR_DUMP_TEMP_FILE or TORCH_NCCL_DEBUG_INFO_TEMP_FILE prefix><rank>`)
writes. Format versions differ in field names; `read_dump` maps every one to `Dump`:

  1.x (torch 2.2-2.3)  entries: record_id, pg_id, seq_id, op_id, profiling_name, input/output_sizes,
                       state, time_created_ns, time_discovered_*_ns, retired, frames;
                       pg_config {pg_id: [ranks]} (from 1.4); no dtypes, no process_group name
  2.x (torch 2.4-2.13) entries add process_group (name, desc), collective_seq_id, p2p_seq_id,
                       is_p2p, input/output_dtypes, timeout_ms, thread_name/id;
                       pg_config {name: {name, desc, ranks: "[0, 1]"}}; pg_status {pg_id:
                       {last_enqueued_collective, last_started_collective, last_completed_collective}}
                       (keyed by the rank's own pg_id, not the group name; JSON writes the numbers as strings)

A dump that is missing, empty or unreadable is still a fact about its rank (`RankDump.problem`):
the culprit of a hang is often exactly the rank whose dump is absent.
"""

from __future__ import annotations

import ast
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

from bprof.errors import DataError, UsageError

NO_SEQ = -1  # torch's own "none yet" in pg_status


@dataclass(slots=True)
class Entry:
    """One Flight Recorder entry: one collective or p2p call of one rank."""

    record_id: int
    pg_name: str
    pg_desc: str
    seq: int  # collective_seq_id (or p2p_seq_id for p2p), per process group, from 1
    is_p2p: bool
    op: str  # profiling_name, e.g. "nccl:all_reduce", "gloo:broadcast"
    input_sizes: tuple
    output_sizes: tuple
    dtypes: tuple  # input dtypes then output dtypes; empty before format 2.x
    state: str  # scheduled / started / completed
    retired: bool
    time_created_ns: int | None
    frames: list  # as dumped: [{"name", "filename", "line"}], innermost first (formatted on use: cheap at scale)

    @property
    def completed(self) -> bool:
        return self.state == "completed" or self.retired

    def signature(self) -> tuple:
        """What every member of a collective must agree on."""
        return (self.op.split(":")[-1], self.input_sizes, self.output_sizes, self.dtypes)


@dataclass(frozen=True)
class GroupStatus:
    """A rank's progress in one process group (sequence numbers; NO_SEQ = none)."""

    last_enqueued: int
    last_started: int
    last_completed: int


@dataclass
class RankDump:
    """One rank's dump, or why there is none (`problem`: "missing", "empty", "unreadable: ...")."""

    rank: int
    path: Path | None
    version: str = ""
    entries: list[Entry] = field(default_factory=list)
    pg_ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)  # group name -> members
    pg_desc: dict[str, str] = field(default_factory=dict)
    pg_status: dict[str, GroupStatus] = field(default_factory=dict)
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem


_RANK_RE = re.compile(r"(\d+)(?:\.(?:pkl|pickle|json|fr\.pkl|fr\.json))?$")


def rank_of(path: Path) -> int | None:
    """The rank a dump file is for: its name's trailing number (torch appends the rank)."""
    m = _RANK_RE.search(path.name)
    return int(m.group(1)) if m else None


def read_dump(path: Path, rank: int) -> RankDump:
    """One rank's dump file, pickle or JSON; an empty or unreadable file is reported, not raised."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return RankDump(rank, path, problem=f"unreadable: {exc.strerror or exc}")
    if not raw.strip():
        return RankDump(rank, path, problem="empty")
    try:
        data = json.loads(raw) if raw.lstrip()[:1] in (b"{", b"[") else pickle.loads(raw)  # noqa: S301 - the user's own dump
    except Exception as exc:  # a truncated pickle raises anything from EOFError to UnpicklingError
        return RankDump(rank, path, problem=f"unreadable: {type(exc).__name__}: {exc}")
    if not isinstance(data, dict) or "entries" not in data and "version" not in data:
        return RankDump(rank, path, problem="unreadable: not a Flight Recorder dump (no 'entries')")
    try:
        return parse_dump(data, rank, path)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        return RankDump(rank, path, problem=f"unreadable: malformed dump ({type(exc).__name__}: {exc})")


def parse_dump(data: dict, rank: int, path: Path | None = None) -> RankDump:
    """A dump already loaded (pickle or JSON object) as a RankDump, whatever its format version."""
    dump = RankDump(rank, path, version=str(data.get("version", "")))
    pg_names = {}  # pg_id -> name, from 2.x entries, to read 1.x-style pg_config keyed by id
    for e in data.get("entries") or []:
        entry = _entry(e)
        dump.entries.append(entry)
        if "pg_id" in e:
            pg_names[str(e["pg_id"])] = entry.pg_name
        dump.pg_desc.setdefault(entry.pg_name, entry.pg_desc)
    for key, cfg in (data.get("pg_config") or {}).items():
        if isinstance(cfg, dict):  # 2.x: {name: {name, desc, ranks: "[0, 1]"}}
            name = str(cfg.get("name", key))
            ranks = cfg.get("ranks", [])
            ranks = ast.literal_eval(ranks) if isinstance(ranks, str) else ranks
            if cfg.get("desc"):
                dump.pg_desc[name] = str(cfg["desc"])
        else:  # 1.x: {pg_id: [ranks]}
            name, ranks = pg_names.get(str(key), str(key)), cfg
        if name and ranks:  # gloo writes one placeholder {'': {ranks: '[]'}}
            dump.pg_ranks[name] = tuple(int(r) for r in ranks)
    for pg_id, st in (data.get("pg_status") or {}).items():
        name = pg_names.get(str(pg_id))  # keyed by the rank's own pg_id, which entries map to a name
        if name is None:
            continue  # a group with no entry left in the ring: it cannot be named
        dump.pg_status[name] = GroupStatus(int(st.get("last_enqueued_collective", NO_SEQ)),
                                                int(st.get("last_started_collective", NO_SEQ)),
                                                int(st.get("last_completed_collective", NO_SEQ)))
    if not dump.entries and not dump.pg_status:
        dump.problem = "empty"
    return dump


def _entry(e: dict) -> Entry:
    pg = e.get("process_group")
    pg_name, pg_desc = (str(pg[0]), str(pg[1])) if pg else (str(e.get("pg_id", "")), "")
    is_p2p = bool(e.get("is_p2p", False))
    if is_p2p:
        seq = e.get("p2p_seq_id", 0)
    else:
        seq = e.get("collective_seq_id", e.get("seq_id", 0))
    frames = e.get("frames") or []
    return Entry(record_id=int(e.get("record_id", -1)), pg_name=pg_name, pg_desc=pg_desc, seq=int(seq),
                 is_p2p=is_p2p, op=str(e.get("profiling_name", "")),
                 input_sizes=_sizes(e.get("input_sizes")), output_sizes=_sizes(e.get("output_sizes")),
                 dtypes=tuple(e.get("input_dtypes") or ()) + tuple(e.get("output_dtypes") or ()),
                 state=str(e.get("state", "scheduled")), retired=bool(e.get("retired", False)),
                 time_created_ns=e.get("time_created_ns"), frames=frames)


def format_frame(f: dict) -> str:
    """One dumped frame as "function (file:line)"."""
    return f"{f.get('name', '?')} ({f.get('filename', '?')}:{f.get('line', '?')})"


def _sizes(sizes) -> tuple:
    return tuple(tuple(int(d) for d in s) for s in sizes or ())


# -- finding the dumps of a job --------------------------------------------------------------

_SKIP_SUFFIXES = (".txt", ".log", ".md", ".stack", ".gz", ".duckdb")


def find_dumps(paths: list[Path]) -> dict[int, Path]:
    """Rank -> dump file, from files and folders (a `bprof record` run directory reads its hang/)."""
    found: dict[int, Path] = {}
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path}: no such file or directory")
        if path.is_dir() and (path / "hang").is_dir():
            path = path / "hang"
        files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
        for f in files:
            if f.name.endswith(_SKIP_SUFFIXES) or f.name in ("ranks.json", "verdict.json"):
                continue
            rank = rank_of(f)
            if rank is None:
                if path.is_file():
                    raise UsageError(f"{f}: cannot tell the rank from the name (torch names dumps <prefix><rank>)")
                continue
            if rank in found and found[rank] != f:
                raise UsageError(f"{f}: a second dump for rank {rank} (the first: {found[rank]})")
            found[rank] = f
    return found


@dataclass
class JobDumps:
    """Everything known about a stuck job: each rank's dump (or its problem), members, liveness."""

    dumps: dict[int, RankDump]
    world_size: int
    pg_ranks: dict[str, tuple[int, ...]]  # group name -> members (from any source)
    pg_desc: dict[str, str]
    dead: dict[int, str] = field(default_factory=dict)  # rank -> how it ended ("exit code 1", ...)
    stacks: dict[int, list[str]] = field(default_factory=dict)  # rank -> training thread, innermost first
    sources: list[str] = field(default_factory=list)
    unresponsive: list[int] = field(default_factory=list)  # alive but did not answer bprof's request


def load_job(paths: list[Path], world_size: int | None = None) -> JobDumps:
    """Read every dump under the paths, plus what `bprof record --hang-timeout` wrote beside them
    (hang/ranks.json: world size, group members, which ranks had died; rank<R>.stack.txt, and
    rank<R>.native_stack.txt of a rank that did not answer, preferred)."""
    files = find_dumps(paths)
    info = _read_ranks_json(paths)
    world = int(world_size or info.get("world_size") or 0)
    dumps = {rank: read_dump(path, rank) for rank, path in files.items()}
    pg_ranks: dict[str, tuple[int, ...]] = {}
    pg_desc: dict[str, str] = {}
    for name, members in (info.get("pg_ranks") or {}).items():
        pg_ranks[name] = tuple(int(r) for r in members)
    for name, desc in (info.get("pg_desc") or {}).items():
        pg_desc[name] = desc
    for d in dumps.values():
        for name, members in d.pg_ranks.items():
            pg_ranks.setdefault(name, members)
        for name, desc in d.pg_desc.items():
            if desc:
                pg_desc.setdefault(name, desc)
    if not files and not info:
        raise UsageError(f"{', '.join(map(str, paths))}: no Flight Recorder dumps found")
    known = set(dumps) | {r for m in pg_ranks.values() for r in m}
    world = max(world, max(known) + 1 if known else 0)
    for r in range(world):
        if r not in dumps:
            dumps[r] = RankDump(r, None, problem="missing")
    dead = {int(r): why for r, why in (info.get("dead") or {}).items()}
    stacks = _read_stacks(paths)
    return JobDumps(dumps, world, pg_ranks, pg_desc, dead, stacks, [str(p) for p in files.values()],
                    sorted(int(r) for r in info.get("unresponsive") or []))


def _read_ranks_json(paths: list[Path]) -> dict:
    for path in paths:
        for cand in (path / "hang" / "ranks.json", path / "ranks.json"):
            if cand.is_file():
                try:
                    return json.loads(cand.read_text())
                except ValueError as exc:
                    raise DataError(f"{cand}: unreadable ({exc})") from None
    return {}


def _read_stacks(paths: list[Path]) -> dict[int, list[str]]:
    stacks = {}
    for path in paths:
        folder = path / "hang" if (path / "hang").is_dir() else path
        if not folder.is_dir():
            continue
        native = {}
        for f in folder.glob("rank*stack.txt"):
            m = re.match(r"rank(\d+)\.(native_)?stack\.txt$", f.name)
            if m:
                frames = training_thread_frames(f.read_text(errors="replace"))
                (native if m.group(2) else stacks)[int(m.group(1))] = frames
        stacks.update(native)  # taken when the rank did not answer: where it hung, not a late answer
    return stacks


def training_thread_frames(text: str) -> list[str]:
    """The main thread's frames, innermost first, from faulthandler's or py-spy's dump text."""
    blocks, current = [], None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(("Thread ", "Current thread ")):
            current = {"head": s, "frames": []}
            blocks.append(current)
        elif current is not None and s.startswith('File "'):
            m = re.match(r'File "([^"]+)", line (\d+) in (.+)$', s)
            if m:
                current["frames"].append(f"{m.group(3)} ({m.group(1)}:{m.group(2)})")
        elif current is not None and re.match(r"^\S+ \(.+:\d+\)$", s):  # py-spy: "func (file:line)"
            current["frames"].append(s)
    if not blocks:
        return []
    main = [b for b in blocks if "MainThread" in b["head"]]
    # faulthandler lists the main thread last when it is not the current one
    chosen = main[0] if main else blocks[-1]
    frames = [f for f in chosen["frames"] if "bprof/profiler" not in f]
    return frames
