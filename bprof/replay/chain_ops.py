"""Chain replay: rerun a recorded op sequence (bprof.replay.chains) eagerly, and compiled with torch.compile.

The chain is rebuilt from its execution trace nodes: each op by its exact overload, inputs from
outside the chain as tensors of the recorded shape, dtype and strides, inputs from inside it as the
output of the op that wrote them, every other argument by its recorded value. The compile variant
is checked against eager on copies of the same inputs before it is timed: a fix that changes the
results is reported as failed, not as faster. Compilation happens before the timed calls, and its
seconds are reported. torch is imported inside the functions.
"""

from __future__ import annotations

import json
import time
from typing import Callable

from bprof.replay.chains import ChainItem, list_types, wiring
from bprof.replay.ops import _derived, compare
from bprof.replay.plan import spread_of
from bprof.replay.rebuild import KINETO_DTYPES, NotRebuildable, make_tensor
from bprof.replay.results import ReplayResult, classify, judge, samples_result

CHAIN_VARIANTS = ("compile",)
# c10::ScalarType, Layout and MemoryFormat codes as execution traces write them (Int)
_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
                 9: "complex64", 10: "complex128", 11: "bool", 15: "bfloat16"}
_LAYOUTS = {0: "strided"}
_MEMORY_FORMATS = {0: "contiguous_format", 1: "preserve_format", 2: "channels_last", 3: "channels_last_3d"}


def replay_chain(torch, item: ChainItem, dev, variants: tuple[str, ...], repeats: int, min_time_s: float,
                 num_threads: int | None) -> list[ReplayResult]:
    """The eager replay of the chain and, if asked, its torch.compile variant; one ReplayResult each."""
    nodes = [json.loads(n[2] or "{}") for n in item.nodes]
    base = ReplayResult(item.kind, item.label, item.key, item.rank, "baseline", "not_rebuildable", dev.type,
                        shapes=[n.get("shapes") for n in nodes], dtypes=[n.get("types") for n in nodes],
                        strides=[n.get("strides") for n in nodes], num_threads=num_threads,
                        calls_per_step=item.calls_per_step, traced_ns=int(_median(item.traced_ns)),
                        traced_spread_frac=spread_of(item.traced_ns), traced_basis=_basis(item),
                        finding_id=item.finding_id, finding_title=item.finding_title)
    try:
        chain, inputs = build_chain(torch, item, dev)
    except NotRebuildable as exc:
        base.reason = str(exc)
        return [base]
    fns: dict[str, Callable] = {"baseline": lambda: chain(*inputs)}
    out: list[ReplayResult] = []
    notes: dict[str, str] = {}
    if "compile" in variants:
        compiled, problem, seconds = _compiled(torch, chain, inputs)
        if problem:
            out.append(_derived(base, "compile", "failed", problem))
        else:
            fns["compile"] = lambda: compiled(*inputs)
            notes["compile"] = f"torch.compile (inductor) of the chain as one function; compiled in {seconds:.1f} s, before the timed calls"
    try:
        samples = compare(torch, dev, fns, repeats, min_time_s)
    except Exception as exc:  # the chain failed when run for real
        base.status, base.reason = "failed", _first_line(exc)
        return [base]
    samples_result(base, samples["baseline"])
    base.classification = classify(item.traced_ns, base.replayed_samples_ns)
    for name in fns:
        if name == "baseline":
            continue
        r = samples_result(_derived(base, name, "replayed", notes.get(name)), samples[name])
        r.baseline_ns = base.replayed_ns
        r.speedup, r.verdict = judge(samples[name], samples["baseline"])
        out.append(r)
    return [base] + out


def build_chain(torch, item: ChainItem, dev) -> tuple[Callable, list]:
    """(chain, inputs): chain(*inputs) runs the ops in order and returns the tensors it wrote that no
    later op of the chain read (and the last op's). NotRebuildable says which argument is missing."""
    wires = wiring(item.nodes)
    steps, inputs = [], []
    generator = torch.Generator(device="cpu").manual_seed(0)
    read: set[tuple[int, int]] = set()
    for j, ((name, schema, raw_inputs, _outputs), node_wires) in enumerate(zip(item.nodes, wires)):
        op = _overload(torch, name, schema)
        ins = json.loads(raw_inputs or "{}")
        arguments = op._schema.arguments
        values, types = ins.get("values", []), ins.get("types", [])
        if len(values) > len(arguments):
            raise NotRebuildable(f"{name}: the trace has {len(values)} inputs, its schema {len(arguments)}")
        args, kwargs = [], {}
        for i, (value, kind, wire) in enumerate(zip(values, types, node_wires)):
            arg = arguments[i]
            if wire is not None:
                spec = _tensor_spec(torch, wire, _at(ins.get("shapes"), i), _at(ins.get("strides"), i), str(kind), dev,
                                    generator, inputs)
            else:
                spec = ("const", _value(torch, name, i, value, str(kind), str(arg.type)))
            (kwargs.__setitem__(arg.name, spec) if arg.kwarg_only else args.append(spec))
        steps.append((op, args, kwargs))
        read |= {tuple(w[1:]) for w in _flat(node_wires) if w and w[0] == "op"}
    last = len(steps) - 1

    def chain(*tensors):
        outs: list[tuple] = []
        for op, args, kwargs in steps:
            result = op(*[_resolve(a, tensors, outs) for a in args], **{k: _resolve(v, tensors, outs) for k, v in kwargs.items()})
            outs.append(tuple(result) if isinstance(result, (tuple, list)) else (result,))
        return tuple(t for j, o in enumerate(outs) for m, t in enumerate(o)
                     if isinstance(t, torch.Tensor) and (j == last or (j, m) not in read))
    _probe(torch, name="chain", fn=chain, inputs=inputs)
    return chain, inputs


def _tensor_spec(torch, wire, shape, stride, kind: str, dev, generator, inputs: list):
    """("ext", k) / ("op", j, m) / ("list", [...]); external tensors are made once, in order of first use."""
    if not wire or not isinstance(wire[0], str):  # a list of tensors (or Nones)
        kinds = list_types(kind) if kind.startswith("GenericList[") else []
        return ("list", [("const", None) if w is None else
                         _tensor_spec(torch, w, _at(shape, k), _at(stride, k), kinds[k] if k < len(kinds) else "", dev,
                                      generator, inputs)
                         for k, w in enumerate(wire)])
    if wire[0] == "op":
        return ("op", wire[1], wire[2])
    k = wire[1]
    if k == len(inputs):
        dtype_name = KINETO_DTYPES.get(kind[len("Tensor("):-1]) if kind.startswith("Tensor(") else None
        if dtype_name is None:
            raise NotRebuildable(f"an input tensor of type {kind or '?'} is not one replay can make")
        inputs.append(make_tensor(torch, shape, stride or [], getattr(torch, dtype_name), dev, generator))
    return ("ext", k)


def _at(values, i):
    return values[i] if isinstance(values, list) and i < len(values) else []


def _value(torch, op: str, i: int, value, kind: str, schema_type: str):
    """A non-tensor argument from its recorded value; the schema says when an Int is a dtype, layout or format."""
    if kind == "None":
        return None
    base_type = schema_type.rstrip("?")
    if kind == "Int" and isinstance(value, int):
        for prefix, table, module in (("ScalarType", _SCALAR_TYPES, torch), ("Layout", _LAYOUTS, torch),
                                      ("MemoryFormat", _MEMORY_FORMATS, torch)):
            if base_type == prefix:
                if value not in table:
                    raise NotRebuildable(f"{op}: argument {i} is {prefix} code {value}, not one replay knows")
                return getattr(module, table[value])
        return value
    if kind == "Double" and isinstance(value, (int, float)):
        return float(value)
    if kind == "Bool" and isinstance(value, bool):
        return value
    if kind == "String" and isinstance(value, str):
        return value
    if kind == "Device" and isinstance(value, str):
        return torch.device(value)
    if kind.startswith("GenericList[") and isinstance(value, list) and all(isinstance(v, (int, float, bool)) for v in value):
        return list(value)
    raise NotRebuildable(f"{op}: argument {i} is a {kind} ({str(value)[:40]}): not one replay can rebuild")


def _overload(torch, name: str, schema: str | None):
    qualified = (schema or name).split("(")[0]
    namespace, _, rest = qualified.partition("::")
    op_name, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), op_name), overload or "default")
    except (AttributeError, RuntimeError):
        raise NotRebuildable(f"torch {torch.__version__} has no op {qualified}") from None


def _resolve(spec, tensors, outs):
    kind = spec[0]
    if kind == "const":
        return spec[1]
    if kind == "ext":
        return tensors[spec[1]]
    if kind == "op":
        return outs[spec[1]][spec[2]]
    return [_resolve(s, tensors, outs) for s in spec[1]]


def _flat(wires):
    for w in wires:
        if isinstance(w, list) and w and not isinstance(w[0], str):
            yield from _flat(w)
        elif w:
            yield w


def _probe(torch, name: str, fn: Callable, inputs: list) -> None:
    """Run the chain once on copies of its inputs: a chain the recorded arguments cannot drive is not rebuildable."""
    try:
        fn(*[t.clone() for t in inputs])
    except Exception as exc:
        raise NotRebuildable(f"the rebuilt {name} fails: {_first_line(exc)}") from None


def _compiled(torch, chain: Callable, inputs: list) -> tuple[Callable | None, str | None, float]:
    """(compiled chain, None, seconds to compile) or (None, why it cannot stand in for the chain, seconds)."""
    t0 = time.perf_counter()
    try:
        compiled = torch.compile(chain, dynamic=False)
        got = compiled(*[t.clone() for t in inputs])
    except Exception as exc:
        return None, f"torch.compile failed: {_first_line(exc)}", time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    want = chain(*[t.clone() for t in inputs])
    for k, (a, b) in enumerate(zip(got, want)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return None, f"the compiled chain's output {k} is {tuple(a.shape)} {a.dtype}, eager's {tuple(b.shape)} {b.dtype}", seconds
        if a.is_floating_point() and not torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-4, equal_nan=True):
            worst = (a.float() - b.float()).abs().max().item()
            return None, f"the compiled chain's output {k} differs from eager's by up to {worst:.3g}", seconds
    return compiled, None, seconds


def _basis(item: ChainItem) -> str:
    what = "device time of the kernels its ops launched" if item.traced_on == "cuda" else "sum of its ops' durations"
    return f"{what} per chain"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _median(values):
    import statistics
    return statistics.median(values)
