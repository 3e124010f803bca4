#!/usr/bin/env bash
# The main job: a real 4-rank torchrun of the example GPT trainer (TP=2 x DP=2, gloo on CPU),
# profiled on every rank, ingested into a DuckDB store and summarised. Then a synthetic
# 8-GPU run with planted ground truth, to show the GPU/NCCL paths on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/demo
rm -rf "$out"
mkdir -p "$out"
db="$out/bprof.duckdb"

echo "== recording: torchrun --nproc_per_node=4 examples/train_gpt.py --tp 2 --dp 2 (CPU, gloo)"
OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=4 \
    examples/train_gpt.py --tp 2 --dp 2 --steps 8 --profile-dir "$out/traces" --profile-steps 3:6 \
    > "$out/train.log" 2>&1 || { cat "$out/train.log"; exit 1; }
grep -E '^bprof-(model|step)' "$out/train.log" | tail -n 3

echo "== ingest"
bprof ingest "$out/traces" --db "$db" --name demo-tp2-dp2
bprof runs --db "$db"
bprof info demo-tp2-dp2 --db "$db"

echo "== a synthetic 8-GPU NCCL run (tp=2 pp=2 dp=2, rank 3 slowed) with its planted truth"
python -m bprof.synth "$out/synthetic" --tp 2 --pp 2 --dp 2 --hosts 2 --slow-rank 3
bprof ingest "$out/synthetic" --db "$db" --name synthetic-tp2-pp2-dp2
bprof info synthetic-tp2-pp2-dp2 --db "$db"
echo "== done: store at $db"
