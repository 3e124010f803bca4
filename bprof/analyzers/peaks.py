"""Which dense peak FLOP/s (and memory bandwidth) divides each rank's work? Never a guess.

In order: a peak given on the command line; for GPUs, the datasheet table of bprof.kernels keyed by
the trace's deviceProperties; for CPU ranks, the peak `bprof calibrate` measured on that host (the
store's device_peaks), shared evenly by the ranks of the run on that host. Otherwise the peak is
unknown and the answer says how to fix it.
"""

from __future__ import annotations

import dataclasses
import json

import duckdb

from bprof.analyzers.base import Options
from bprof.kernels.devices import matmul_peak, normalize_dtype, resolve_device
from bprof.store.peaks import cpu_peak_for_host


@dataclasses.dataclass(frozen=True)
class RankPeak:
    flops_per_s: float | None  # dense peak of one rank's device at the dtype asked for
    mem_bytes_per_s: float | None
    source: str  # where the number comes from, or why there is none


def rank_peaks(con: duckdb.DuckDBPyConnection, run_id: int, options: Options, dtype: str | None) -> dict[int, RankPeak]:
    """Peak per rank at the matmul dtype `dtype` (as traced or normalised; None: bf16 on GPUs, fp32 on CPUs)."""
    rows = con.execute("""
        SELECT r.rank, r.host, r.device_name, r.device_index, r.device_properties,
               (SELECT count(*) FROM ranks o WHERE o.run_id = r.run_id AND o.host IS NOT DISTINCT FROM r.host) AS ranks_on_host,
               EXISTS (SELECT 1 FROM timeline_spans s WHERE s.run_id = r.run_id AND s.rank = r.rank AND s.timeline = 'device') AS on_gpu
        FROM ranks r WHERE r.run_id = ? ORDER BY r.rank""", [run_id]).fetchall()
    short = normalize_dtype(dtype) if dtype else None
    out = {}
    for rank, host, device_name, device_index, props_json, ranks_on_host, on_gpu in rows:
        if options.peak_flops_per_s:
            out[rank] = RankPeak(options.peak_flops_per_s, None, "given on the command line (--peak-tflops)")
        elif on_gpu:
            # unknown matmul dtype: the usual denominator, bf16 dense (fp16 on devices without bf16)
            out[rank] = _gpu_peak(props_json, device_index, device_name, short or "bf16", fallback=None if short else "fp16")
        else:
            out[rank] = _cpu_peak(con, host, ranks_on_host, short or "fp32")
    return out


def rank_device_properties(props_json: str | None, device_index: int | None) -> dict | None:
    """The deviceProperties entry of a rank's own device (ranks.device_properties, ranks.device_index):
    the entry with that id, else the first; None when the trace has none."""
    props = json.loads(props_json) if props_json else []
    mine = [p for p in props if p.get("id") == device_index] or props[:1]
    return mine[0] if mine else None


def _gpu_peak(props_json: str | None, device_index: int | None, device_name: str | None, dtype: str,
              fallback: str | None = None) -> RankPeak:
    mine = rank_device_properties(props_json, device_index)
    if not mine:
        return RankPeak(None, None, f"the trace has no deviceProperties for {device_name or 'its device'}; "
                                    "give the peak with --peak-tflops")
    peaks = resolve_device(mine)
    if peaks is None:
        return RankPeak(None, None, f"unknown device {mine.get('name')!r} (not in bprof's peak table); "
                                    "give the peak with --peak-tflops")
    found = matmul_peak(peaks, dtype)
    if found is None and fallback:
        dtype, found = fallback, matmul_peak(peaks, fallback)
    if found is None:
        return RankPeak(None, peaks.mem_bytes_per_s, f"{peaks.device_id} has no {dtype} matmul peak; give one with --peak-tflops")
    flops, which = found
    return RankPeak(flops, peaks.mem_bytes_per_s, f"{peaks.device_id} datasheet, {which} ({peaks.matched_by}; {peaks.source})")


def _cpu_peak(con: duckdb.DuckDBPyConnection, host: str | None, ranks_on_host: int, dtype: str) -> RankPeak:
    if host is None:
        return RankPeak(None, None, "the trace does not name its host, so no calibration applies; "
                                    "record with `bprof record` or give --peak-tflops")
    measured = cpu_peak_for_host(con, host, dtype)
    if measured is None or not measured.flops_per_s:
        return RankPeak(None, None, f"no measured {dtype} peak for host {host!r}: run `bprof calibrate` on it "
                                    "(same --db), or give --peak-tflops")
    share = max(ranks_on_host, 1)
    return RankPeak(measured.flops_per_s / share,
                    measured.mem_bytes_per_s / share if measured.mem_bytes_per_s else None,
                    f"`bprof calibrate` on {host}: {measured.flops_per_s / 1e9:.1f} GFLOP/s {dtype} with "
                    f"{measured.num_threads} threads, shared by the run's {share} rank(s) on that host")
