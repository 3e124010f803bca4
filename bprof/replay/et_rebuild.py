"""Rebuild ops from execution trace nodes: the exact overload, every argument as recorded, tensors wired.

Each node is (name, op_schema, inputs JSON, outputs JSON) as exec_nodes holds it. Inputs that an
earlier node wrote are that node's output; other tensors are made with the recorded shape, dtype and
strides (bprof.replay.rebuild.make_tensor), once per tensor id; every other argument takes its
recorded value, the overload's schema saying when an Int is a dtype, layout or memory format and
which arguments are keyword-only. Used for op chains, and for single ops whose Kineto signature is
not enough (a keyword-only argument, a string, a list of tensors). torch is imported by the callers.
"""

from __future__ import annotations

import json
from typing import Callable

from bprof.replay.chains import list_types, wiring
from bprof.replay.rebuild import KINETO_DTYPES, NotRebuildable, make_tensor

# c10::ScalarType, Layout and MemoryFormat codes as execution traces write them (Int)
_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
                 9: "complex64", 10: "complex128", 11: "bool", 15: "bfloat16"}
_LAYOUTS = {0: "strided"}
_MEMORY_FORMATS = {0: "contiguous_format", 1: "preserve_format", 2: "channels_last", 3: "channels_last_3d"}


def build_nodes(torch, nodes, dev, what: str = "chain") -> tuple[Callable, list]:
    """build_chain for execution trace nodes ((name, op_schema, inputs JSON, outputs JSON), ...): one
    node is one op, rebuilt with every argument the execution trace recorded."""
    wires = wiring(nodes)
    steps, inputs = [], []
    generator = torch.Generator(device="cpu").manual_seed(0)
    read: set[tuple[int, int]] = set()
    for j, ((name, schema, raw_inputs, _outputs), node_wires) in enumerate(zip(nodes, wires)):
        op = _overload(torch, name, schema)
        ins = json.loads(raw_inputs or "{}")
        arguments = op._schema.arguments
        values, types = ins.get("values", []), ins.get("types", [])
        if len(values) > len(arguments):
            raise NotRebuildable(f"{name}: the trace has {len(values)} inputs, its schema {len(arguments)}")
        args, kwargs = [], {}
        for i, (value, kind, wire) in enumerate(zip(values, types, node_wires)):
            arg = arguments[i]
            if str(kind).startswith("Tensor(nullptr"):  # an undefined optional tensor
                spec = ("const", None)
            elif wire is not None:
                spec = _tensor_spec(torch, wire, _at(ins.get("shapes"), i), _at(ins.get("strides"), i), str(kind), dev,
                                    generator, inputs)
            else:
                spec = ("const", _value(torch, name, i, value, str(kind), str(arg.type)))
            if arg.kwarg_only:
                kwargs[arg.name] = spec
            else:
                args.append(spec)
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
    _probe(torch, what, chain, inputs, dev)
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
    if kind in ("None", "Generator"):  # a Generator: the default one draws the same amount of random numbers
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


def _probe(torch, what: str, fn: Callable, inputs: list, dev) -> None:
    """Run the chain once on copies of its inputs: a chain the recorded arguments cannot drive is not
    rebuildable. On the meta device (a dry run), an op that cannot run on meta proves nothing."""
    try:
        fn(*[t.clone() for t in inputs])
    except Exception as exc:
        if not (str(dev) == "meta" and "meta" in str(exc).lower()):
            raise NotRebuildable(f"the rebuilt {what} fails: {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


