#!/usr/bin/env bash
# Resume equivalence with a real SIGKILL: the SYNTHETIC synthetic_cxr task, vit2d_tiny, 4 epochs; one run
# uninterrupted, one killed (kill -9) after epoch 2 and continued with --resume. Prints both results and
# compares metrics.csv (all but timings), the test predictions and the final weights byte for byte.
# Usage: bash benchmarks/resume_equivalence.sh [OUT_DIR]   (default /tmp/medattn-resume-check)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/medattn-resume-check}
M="${PYTHON:-.venv/bin/python} -m medattn"
ARGS="synthetic_cxr data.image_size=32 data.num_samples=[128,64,64] model.name=vit2d_tiny train.epochs=4
      train.batch_size=16 train.lr=1e-3 train.threads=1 --no-progress"
rm -rf "$OUT"; mkdir -p "$OUT"
$M train $ARGS --out "$OUT/full" > "$OUT/full.log" 2>&1
$M train $ARGS --out "$OUT/killed" > "$OUT/killed.log" 2>&1 &
PID=$!
STATE="$OUT/killed/checkpoints/last/checkpoint.json"
until [ -f "$STATE" ] && grep -q '"epoch": 2' "$STATE"; do sleep 0.05; done
kill -9 "$PID" || true
echo "killed after epoch 2"
$M train $ARGS --out "$OUT/killed" --resume > "$OUT/resumed.log" 2>&1
for run in full killed; do
    echo "== $run"; sed -n '/^run /,$p' "$OUT/$([ $run = full ] && echo full.log || echo resumed.log)" | grep -E "best epoch|test AUROC"
done
cut -d, -f1-5 "$OUT/full/metrics.csv" > "$OUT/a"; cut -d, -f1-5 "$OUT/killed/metrics.csv" > "$OUT/b"
cmp "$OUT/a" "$OUT/b" && echo "metrics.csv (all but timings) identical"
cmp "$OUT/full/predictions_test.csv" "$OUT/killed/predictions_test.csv" && echo "predictions_test.csv identical"
cmp "$OUT/full/checkpoints/last/model.safetensors" "$OUT/killed/checkpoints/last/model.safetensors" \
    && echo "final weights identical"
