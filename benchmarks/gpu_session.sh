#!/usr/bin/env bash
# Issue 38's GPU checks in one prepared call, most important first, each step under its own time limit (together
# 530 s, inside the device tool's 10 minutes a call; never yet run on a GPU). From a checkout (no install needed)
# on a CUDA machine with torch and triton:
#     bash benchmarks/gpu_session.sh [RESULTS]      (default reports/gpu)
# and, through the device tool, whose $OUT takes back at most 8 files:
#     bash benchmarks/gpu_session.sh /tmp/gpu && cp /tmp/gpu.tar.gz /tmp/gpu/targets.txt "$OUT"/
# Writes in RESULTS: environment.txt; kernels.txt (tests/attention/test_triton_kernels.py on CUDA tensors: the
# compiled kernels against float64); cuda_tests.txt (`pytest -m cuda`); attention/ (one bf16 layer, forward +
# backward: softmax, SimA, SeqNorm and binary-hamming at N = 1k to 64k, SeqNorm and binary-hamming as `torch` and
# `triton` rows); scaling_b1/, scaling_b4/ (the vit2d training step at 224 and 1024 px, bf16, eager, batch 1 and 4);
# targets.txt and targets/ (benchmarks/kernel_targets.py: each target of the issue, met or not); a log per step;
# then packs RESULTS into RESULTS.tar.gz. Figures go to docs/performance-kernels.md "CUDA kernels (Triton)" with the commit.
# DEVICE, SEQ_LENS, RESOLUTIONS and TESTS (0: no pytest steps) change the run (tests/bench run it on the CPU, tiny).
set -u
cd "$(dirname "$0")/.."
RESULTS=${1:-reports/gpu}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$RESULTS"
step() {  # step SECONDS LOG COMMAND...: run it with its output in RESULTS/LOG; go on whatever it returns
    local limit=$1 log=$2; shift 2
    echo "== $log: $* (limit ${limit} s)"
    timeout "$limit" "$@" > "$RESULTS/$log" 2>&1
    echo "   exit $?: $(tail -n 1 "$RESULTS/$log")"
}
{ nvidia-smi -L 2>&1 | head -n 4; git log -1 --format='commit %H' 2>&1
  $PY -c "import torch, importlib.metadata as m; gpu = torch.cuda.is_available(); print('torch', torch.__version__,
'triton', m.version('triton'), torch.cuda.get_device_name() if gpu else 'no CUDA device')" 2>&1
} > "$RESULTS/environment.txt"
cat "$RESULTS/environment.txt"
if [ "${TESTS:-1}" != 0 ]; then
    step 120 kernels.txt $PY -m pytest -q -p no:cacheprovider tests/attention/test_triton_kernels.py
    step 120 cuda_tests.txt $PY -m pytest -q -p no:cacheprovider -m cuda --continue-on-collection-errors tests
fi
step 150 attention.txt $PY -m medattn bench attention --device "$DEVICE" --precision bf16 --parts layer \
    --passes fwd+bwd --mechanisms softmax,sima,seqnorm,binary-hamming --seq-lens "${SEQ_LENS:-1024,4096,16384,65536}" \
    --no-peers --no-isolate --memory-budget-gb 60 --time-budget 5 --out "$RESULTS/attention" --overwrite
for batch in 1 4; do
    step 60 "scaling_b$batch.txt" $PY -m medattn bench scaling --device "$DEVICE" --mechanisms softmax,sima,seqnorm \
        --resolutions "${RESOLUTIONS:-224,1024}" --precision bf16 --batch-size "$batch" --no-isolate \
        --out "$RESULTS/scaling_b$batch" --overwrite
done
step 20 targets.txt $PY benchmarks/kernel_targets.py --attention "$RESULTS/attention/attention.json" \
    --scaling "$RESULTS/scaling_b1/scaling.json" "$RESULTS/scaling_b4/scaling.json" --out "$RESULTS/targets"
cat "$RESULTS/targets.txt"
tar -czf "$RESULTS.tar.gz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")" && echo "packed $RESULTS.tar.gz"
