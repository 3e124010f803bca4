"""The `dp=N` scenario's model: data-parallel collectives re-costed for N ranks with the alpha-beta
model, its link latency and bandwidth fitted from the run's own data-parallel transfers (or given
by a coll: part of the same scenario).

alpha-beta time of one collective: a(op, n) x latency + c(op, n) x bytes / bandwidth, the
coefficients of bprof.whatif.scenarios.collective_ns (ring; tree for all_reduce, broadcast,
reduce). Fit: least squares of the measured transfers (each instance's median member exit after
its last arrival) on (a, c x bytes), both parameters >= 0; when every transfer has the same
(a, c x bytes), latency and bandwidth cannot be told apart and the fit is bandwidth only.
"""

from __future__ import annotations

import math

import numpy as np

DP_DIMS = ("dp", "fsdp")

_RING = {"all_reduce": (2.0, 2.0), "all_gather": (1.0, 1.0), "reduce_scatter": (1.0, 1.0), "all_to_all": (1.0, 1.0),
         "gather": (1.0, 1.0), "scatter": (1.0, 1.0)}


def coefficients(op: str, n: int, algo: str = "ring") -> tuple[float, float]:
    """(a, c): the collective takes a x latency + c x bytes / bandwidth on n ranks."""
    n = max(int(n), 1)
    if n == 1:
        return 0.0, 0.0
    if op == "barrier":
        return 2.0 * (n - 1), 0.0
    log_n = math.ceil(math.log2(n))
    if algo == "tree" and op == "all_reduce":
        return 2.0 * log_n, 2 * (n - 1) / n
    if algo == "tree" and op in ("broadcast", "reduce"):
        return float(log_n), 1.0
    if op in _RING:
        a, c = _RING[op]
        return a * (n - 1), c * (n - 1) / n
    if op in ("broadcast", "reduce"):
        return float(n - 1), 1.0
    return 1.0, 1.0  # p2p, send, recv: one hop


def model_ns(op: str, size_bytes: int, n: int, latency_s: float, seconds_per_byte: float, algo: str = "ring") -> float:
    a, c = coefficients(op, n, algo)
    return (a * latency_s + c * size_bytes * seconds_per_byte) * 1e9


def fit(op: np.ndarray, size_bytes: np.ndarray, n: np.ndarray, transfer_ns: np.ndarray) -> tuple[float, float, str]:
    """(latency s, seconds per byte, how) from measured transfers: non-negative least squares over
    the two parameters (the full fit, else the better of each alone)."""
    coef = np.array([coefficients(o, k) for o, k in zip(op.tolist(), n.tolist())], dtype=float).reshape(-1, 2)
    x = np.column_stack([coef[:, 0], coef[:, 1] * size_bytes.astype(float)])
    y = transfer_ns.astype(float) / 1e9
    if not len(y):
        raise ValueError("no transfer to fit")
    if np.linalg.matrix_rank(x) >= 2:
        sol, *_ = np.linalg.lstsq(x, y, rcond=None)
        if (sol >= 0).all():
            return float(sol[0]), float(sol[1]), "latency and bandwidth fitted"
    if x[:, 1].any():
        beta = max(float(x[:, 1] @ y / (x[:, 1] @ x[:, 1])), 0.0)
        if np.linalg.matrix_rank(x) < 2:
            return 0.0, beta, "bandwidth only (every message alike: latency and bandwidth cannot be told apart)"
        alpha = max(float(x[:, 0] @ y / (x[:, 0] @ x[:, 0])), 0.0) if x[:, 0].any() else 0.0
        if np.sum((y - x[:, 0] * alpha) ** 2) < np.sum((y - x[:, 1] * beta) ** 2):
            return alpha, 0.0, "latency only (the better non-negative fit)"
        return 0.0, beta, "bandwidth only (the better non-negative fit)"
    alpha = max(float(x[:, 0] @ y / (x[:, 0] @ x[:, 0])), 0.0) if x[:, 0].any() else 0.0
    return alpha, 0.0, "latency only (no message size known)"
