"""Rebuild an op's inputs from its recorded Input Dims / Input type / Input Strides / Concrete Inputs.

Tensors get the recorded shape, dtype and strides (a transposed or sliced view stays one: the
values live in a flat buffer viewed with as_strided). torch is imported inside the functions.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Callable

# Kineto "Input type" -> torch dtype attribute
KINETO_DTYPES = {
    "float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
    "long int": "int64", "long": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
    "unsigned char": "uint8", "bool": "bool", "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
    "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2",
}


class NotRebuildable(Exception):
    """The recorded signature does not say enough to call the op again; the message says why."""


@dataclass
class Rebuilt:
    """A callable op and its arguments; `tensors` are the indices of the tensor arguments."""

    op: Callable
    args: list[Any]
    tensors: list[int]

    def __call__(self):
        return self.op(*self.args)


def resolve_op(torch, name: str):
    namespace, _, short = name.partition("::")
    if not short:
        raise NotRebuildable(f"{name} is not a namespaced op")
    try:
        return getattr(getattr(torch.ops, namespace), short)
    except (AttributeError, RuntimeError):
        raise NotRebuildable(f"torch {torch.__version__} has no op {name}") from None


def rebuild(torch, name: str, dims: list, types: list, strides: list, concrete: list, device) -> Rebuilt:
    """The op and its inputs on `device`; NotRebuildable names the argument it cannot make."""
    op = resolve_op(torch, name)
    args, tensors = [], []
    generator = torch.Generator(device="cpu").manual_seed(0)
    for i, kind in enumerate(types):
        shape = dims[i] if i < len(dims) else []
        stride = strides[i] if i < len(strides) else []
        value = concrete[i] if i < len(concrete) else ""
        if kind in KINETO_DTYPES:
            args.append(make_tensor(torch, shape, stride, getattr(torch, KINETO_DTYPES[kind]), device, generator))
            tensors.append(i)
        elif kind == "":
            args.append(None)  # an optional argument left out (Kineto writes no type for None)
        elif kind in ("Scalar", "ScalarList"):
            if value == "":
                raise NotRebuildable(f"argument {i} ({kind}) was recorded without its value")
            args.append(_literal(value))
        else:
            raise NotRebuildable(f"argument {i} is a {kind}: the trace records its shapes, not how to call the op with it")
    try:
        probe = Rebuilt(op, [_on_meta(torch, a) for a in args], tensors)
        probe()
    except NotRebuildable:
        raise
    except Exception as exc:  # the op refuses the rebuilt arguments: wrong schema guess, unsupported on meta, ...
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "meta" not in message.lower():
            raise NotRebuildable(f"{name} rejects the rebuilt arguments: {message[:160]}") from None
    return Rebuilt(op, args, tensors)


def make_tensor(torch, shape: list, stride: list, dtype, device, generator=None):
    """A tensor of `shape` and `dtype` whose strides are `stride` (as_strided over a flat buffer)."""
    if not isinstance(shape, list) or any(not isinstance(d, int) for d in shape):
        raise NotRebuildable(f"shape {shape!r} is not a list of sizes")
    if not stride or len(stride) != len(shape):
        stride = _contiguous_strides(shape)
    numel = 1 + sum((d - 1) * s for d, s in zip(shape, stride)) if all(d > 0 for d in shape) else 0
    if str(device) == "meta":
        return torch.empty(numel, dtype=dtype, device="meta").as_strided(shape, stride)
    if dtype.is_floating_point or dtype.is_complex:
        flat = torch.randn(numel, generator=generator, dtype=torch.float32).to(dtype)
    else:
        flat = torch.zeros(numel, dtype=dtype)  # indices stay valid: 0 is in range of every embedding
    return flat.to(device).as_strided(shape, stride)


def _contiguous_strides(shape: list) -> list:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return list(reversed(strides))


def _literal(text: str):
    if text in ("True", "False"):
        return text == "True"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if text.endswith("."):  # Kineto writes 0. for a float zero
            return float(text)
        raise NotRebuildable(f"cannot read the recorded value {text!r}") from None


def _on_meta(torch, value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value
