#!/usr/bin/env bash
# The main job: `bprof record` runs a real 4-rank torchrun of the example GPT trainer (TP=2 x
# DP=2, gloo on CPU) with no change to its code, captures iterations 3-5 on every rank, ingests
# them into a DuckDB store, summarises and analyses the run, predicts two fixes (whatif), reruns its
# top op and collective (replay) and writes the web report. Then a synthetic 8-GPU NCCL run with planted
# ground truth shows the GPU/NCCL paths on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/demo
rm -rf "$out"
mkdir -p "$out"
db="$out/bprof.duckdb"

echo "== bprof record -- torchrun --nproc_per_node=4 examples/train_gpt.py --tp 2 --dp 2 (CPU, gloo)"
OMP_NUM_THREADS=1 bprof record --out "$out/record" --name demo-tp2-dp2 --steps 3:6 --db "$db" -- \
    python -m torch.distributed.run --standalone --nproc_per_node=4 \
    examples/train_gpt.py --tp 2 --dp 2 --steps 8 > "$out/train.log" 2> "$out/record.log" \
    || { cat "$out/train.log" "$out/record.log"; exit 1; }
grep -E '^bprof-(model|step)' "$out/train.log" | tail -n 2
grep -v -E '^(USDT|\s*$)' "$out/record.log" | grep -E '^(bprof|│|┃|┏|┡|└|┗|\s+run)' || true
bprof info demo-tp2-dp2 --db "$db"

echo "== bprof calibrate (this machine's measured fp32 peak: the MFU denominator of CPU runs) and bprof analyze"
bprof calibrate --db "$db" --dtype fp32 --repeats 3
bprof analyze demo-tp2-dp2 --db "$db"
echo "== bprof whatif: the step replayed from its dependency graph, unchanged and with two fixes"
bprof whatif demo-tp2-dp2 --db "$db" -s no-host-gaps -s perfect-overlap
echo "== bprof replay: the top op and collective rerun here, fp32 against bf16"
bprof replay demo-tp2-dp2 --db "$db" --top 1 --variant bf16 --repeats 3 2> "$out/replay.log" \
    || { cat "$out/replay.log"; exit 1; }
echo "== bprof report --html: the web report of the recorded run as one offline file (bprof report --serve serves it)"
bprof report demo-tp2-dp2 --db "$db" --html "$out/report.html"

echo "== a synthetic 8-GPU NCCL run (tp=2 pp=2 dp=2, rank 3 slowed by 5 ms per step) with its planted truth: the analysis names rank 3"
python -m bprof.synth "$out/synthetic" --tp 2 --pp 2 --dp 2 --hosts 2 --slow-rank 3
bprof ingest "$out/synthetic" --db "$db" --name synthetic-tp2-pp2-dp2
bprof analyze synthetic-tp2-pp2-dp2 --db "$db" --top 10
bprof runs --db "$db"
echo "== done: store at $db; run directory $out/record; report $out/report.html"
