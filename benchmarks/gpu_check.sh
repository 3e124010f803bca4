#!/usr/bin/env bash
# GPU readiness, in one short run on the accelerator machine (the `device` tool, when a session is
# lent one; 15 minutes a session, start-up included). It records a 1-GPU run of the example trainer
# with CUDA under `bprof record`, checks that kernels, launches (cudaLaunchKernel and the driver
# API's cuLaunchKernelEx), memcpy and sync events land in the store, runs `bprof calibrate --device
# cuda` and `bprof replay --device cuda --top 3`, and prints one summary line per check.
#
# That machine has torch, numpy, pandas, pyarrow, scipy, numba, rich and typer, but not duckdb or
# orjson: fetch their wheels here once (Python 3.12, x86-64), then carry .whl:
#     echo /.whl/ >> .git/info/exclude
#     benchmarks/gpu_check.sh --fetch-wheels
# and on the device (tool `run`, carry [".whl"], timeout_s 420):
#     benchmarks/gpu_check.sh
# Exit 0 when every check passed, 1 otherwise; everything it wrote is under $OUT (or /tmp/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--fetch-wheels" ]; then
    for pkg in duckdb==2.0.1 orjson==3.13.0; do  # the versions CI installs here
        python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 -d .whl "$pkg" || exit 1
    done
    exit 0
fi

out="${OUT:-/tmp/gpu_check}"
mkdir -p "$out"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:$PWD" || { echo "FAIL wheels: could not install .whl"; exit 1; }
else
    export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
db="$out/gpu.duckdb"
failed=0
check() {  # check NAME CONDITION-COMMAND...
    local name="$1"; shift
    if "$@"; then echo "PASS $name"; else echo "FAIL $name"; failed=1; fi
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"

# 1. a real recording on one GPU (torchrun, nccl)
python3 -m bprof.cli.main record --out "$out/run" --db "$db" --name gpu --steps 3:6 -- \
    python3 -m torch.distributed.run --standalone --nproc_per_node=1 examples/train_gpt.py \
    --device cuda --steps 7 --hidden 256 --layers 4 --seq 128 > "$out/record.log" 2>&1
check "record: bprof record of train_gpt.py on cuda exits 0" test $? -eq 0

count() {  # count SQL: one number from the store
    python3 - "$db" "$1" <<'PY'
import sys, duckdb
print(duckdb.connect(sys.argv[1], read_only=True).execute(sys.argv[2]).fetchone()[0])
PY
}
if [ -f "$db" ]; then
    kernels=$(count "SELECT count(*) FROM events WHERE kind = 'kernel'")
    runtime=$(count "SELECT count(*) FROM events WHERE kind = 'cuda_runtime' AND name LIKE 'cudaLaunchKernel%'")
    driver=$(count "SELECT count(*) FROM events WHERE kind = 'cuda_driver' AND name LIKE 'cuLaunchKernel%'")
    memcpy=$(count "SELECT count(*) FROM events WHERE kind IN ('gpu_memcpy', 'gpu_memset')")
    syncs=$(count "SELECT count(*) FROM events WHERE kind IN ('cuda_runtime', 'cuda_sync') AND name LIKE '%ynchronize%'")
    linked=$(count "SELECT count(*) FROM events k WHERE k.kind = 'kernel' AND k.step IS NOT NULL")
    echo "store: $kernels kernels ($linked with a step), $runtime runtime launches, $driver driver-API launches, $memcpy memcpy/memset, $syncs syncs"
    check "kernels in the store" test "$kernels" -gt 0
    check "launches (runtime or driver API) in the store" test $((runtime + driver)) -gt 0
    check "every kernel has its step, through either launch API" test "$linked" -gt 0
    check "memcpy or memset on the device" test "$memcpy" -gt 0
    python3 -m bprof.cli.main analyze --db "$db" --json > "$out/analyze.json" 2> "$out/analyze.err"
    check "analyze exits 0" test $? -eq 0
    python3 -m bprof.cli.main whatif --db "$db" -s no-host-gaps > "$out/whatif.txt" 2>&1
    check "whatif: the unchanged replay is exact (exit 0)" test $? -eq 0
fi

# 2. calibrate the device peaks, then replay the top ops on the device
python3 -m bprof.cli.main calibrate --db "$db" --device cuda --repeats 3 > "$out/calibrate.txt" 2>&1
check "calibrate --device cuda exits 0" test $? -eq 0
python3 -m bprof.cli.main replay --db "$db" --device cuda --top 3 > "$out/replay.txt" 2>&1
check "replay --device cuda --top 3 exits 0" test $? -eq 0
tail -5 "$out/calibrate.txt" "$out/replay.txt"
echo "summary: $([ $failed -eq 0 ] && echo 'all checks passed' || echo 'some checks FAILED') (logs in $out)"
exit $failed
