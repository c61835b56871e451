#!/usr/bin/env bash
# Every check this project makes on a GPU, in one run, each written to OUT/<check>.log:
#
#     bash scripts/gpu_checks.sh OUT [TEST_SECONDS]
#
# 1. the benchmarks on CUDA, alone on the GPU, float32 and float16 autocast (docs/performance.md,
#    "On a GPU"), with the operation counts, and the profile of a potential step;
# 2. the test files that read TEST_DEVICE, with TEST_DEVICE=cuda
#    TEST_DTYPES=float16,float32,float64 (docs/robustness.md), for at most TEST_SECONDS
#    (default 900), named test by test (-v) and in OUT/tests.xml, so that a run stopped early
#    still names its failures; beside it, a --quick bench of three losses with the
#    fine-tuned trunk (docs/bench.md), whose timings are then not a measurement.
#
# Needs the test and bench extras, a faiss, and pytest-xdist (-n: TEST_WORKERS, default 8).
set -u
out=${1:?usage: bash scripts/gpu_checks.sh OUT [TEST_SECONDS]}
test_seconds=${2:-900}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
cd "$(dirname "$0")/.." || exit 1
python - <<'EOF' || exit 2
import sys
try:
    import torch
except ImportError as error:
    sys.exit(f"gpu_checks.sh: {error}")
if not torch.cuda.is_available():
    sys.exit("gpu_checks.sh: torch sees no CUDA device")
EOF
export PYTHONUNBUFFERED=1
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python -c "import sys, torch, pytorch_metric_learning as p; print(sys.version.split()[0], torch.__version__, torch.version.cuda, p.__version__)"
} > "$out/environment.log" 2>&1

for autocast in none float16; do
    python benchmarks/bench_relational_head.py --device cuda --autocast $autocast
    python benchmarks/bench_losses.py --device cuda --autocast $autocast --losses ProxyAnchor MFCont MFCWMS CWMS PFML CPML \
        --batch-sizes 180 --num-classes 11318 --reps 15 --no-memory --ops
done > "$out/benchmarks.log" 2>&1
python benchmarks/bench_potential_training.py --device cuda > "$out/potential_training.log" 2>&1
python benchmarks/profile_potential_step.py --device cuda > "$out/profile.log" 2>&1
python benchmarks/profile_potential_step.py --device cuda --loss CPML --after 75 >> "$out/profile.log" 2>&1

device_tests=$(grep -l "DEVICE" tests/test_*.py tests/losses/test_*.py)
TEST_DEVICE=cuda TEST_DTYPES=float16,float32,float64 timeout "$test_seconds" \
    python -m pytest -v -rfE -p no:cacheprovider -n "${TEST_WORKERS:-8}" --junit-xml "$out/tests.xml" \
    $device_tests > "$out/tests.log" 2>&1 &
tests=$!
timeout "$test_seconds" pml-fieldlosses bench --quick --seeds 1 --losses ProxyAnchor,PFML,CPML \
    --backbone efficientnet-lite0-finetune --device cuda --out "$out/finetune" > "$out/finetune.log" 2>&1
wait $tests
# (pytest-xdist's -v lines: "[gw3] [ 45%] PASSED tests/...", the summary at the end if it got there)
progress='^\[gw[0-9]+\] \[ *[0-9]+%\]'
echo "tests: $(grep -cE "$progress PASSED" "$out/tests.log") passed, $(grep -cE "$progress (FAILED|ERROR)" "$out/tests.log") failed"
grep -E "$progress (FAILED|ERROR)" "$out/tests.log"
tail -n 1 "$out/tests.log"
echo "logs in $out"
