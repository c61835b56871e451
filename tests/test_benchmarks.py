"""The benchmark scripts run end to end on tiny sizes (their numbers are for
the docs, measured at full size; nothing here is timed)."""

import re
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_potential_training_prints_a_ratio_per_stage_and_loss():
    args = "--num-classes 40 300 --steps 60 --batch-size 32 --embedding-size 16 --input-size 16 --window 3 --threads 1"
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_potential_training.py"), *args.split()],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    for C in (40, 300):
        for name in ("PFML", "CPML"):
            # the table's line (each window's cell is also printed alone as it closes)
            (line,) = [line for line in out.splitlines() if re.match(rf"N={C}\s+{name}\s+start.*\| end", line)]
            ratios = re.findall(r"vs\s+[0-9]+ ms x\s*([0-9.]+)", line)
            assert len(ratios) == 3 and all(float(r) > 0 for r in ratios), line
            assert line.count("moves") == 3 and line.count("median") == 3, line
    # N = 300 is past the dense path: the neighbour list is used and its skin printed
    assert re.search(r"N=300\s+PFML\s+60 steps; last skin", out), out


def run_script(name, args):
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args.split()],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout


def test_loss_benchmark_prints_ratios_under_autocast():
    out = run_script("bench_losses.py", "--quick --no-memory --losses MFCont --autocast bfloat16")
    assert out.startswith("device=cpu (CPU) autocast=bfloat16"), out
    (row,) = [line for line in out.splitlines() if line.split()[2:3] == ["MFCont"]]
    assert float(row.split()[4]) > 0, row


def test_precision_benchmark_deviations_are_ordered():
    out = run_script("bench_precision.py", "--steps 3")
    assert out.startswith("device=cpu (CPU)") and "3 random batches per loss" in out, out
    rows = [line.split() for line in out.splitlines() if re.search(r"\d\.\d\de-?\+?\d\d", line)]
    assert rows, out
    for row in rows:
        median, p95, largest = (float(v) for v in row[-7:-4])
        assert median <= p95 <= largest, row  # quantiles within the sample, never extrapolated


def test_relational_head_benchmark_prints_a_ratio_per_step():
    args = "--batch-size 16 --in-features 32 --embedding-size 16 --num-branches 4 --num-classes 5 --reps 2 --clock cpu"
    out = run_script("bench_relational_head.py", args)
    assert "autocast=none" in out.splitlines()[0], out
    for step in ("linear", "relational", "relational head + base loss only"):
        (line,) = [line for line in out.splitlines() if re.match(rf"{re.escape(step)}\s+[0-9.]+\s+[0-9.]+$", line)]
        assert float(line.split()[-1]) > 0, line


def test_benchmarks_refuse_a_device_torch_cannot_use():
    for name in ("bench_losses.py", "bench_precision.py", "bench_relational_head.py", "bench_potential_training.py"):
        result = subprocess.run(
            [sys.executable, str(BENCHMARKS / name), "--device", "nonsense"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2 and "--device" in result.stderr.splitlines()[-1], (name, result.stderr)


def test_epoch_overhead_benchmark_prints_old_and_new_per_part():
    args = "--reps 1 --samples 600 --features 64 --classes 50 --autocast bfloat16"
    out = run_script("bench_epoch_overhead.py", args)
    assert out.startswith("device=cpu (CPU) autocast=bfloat16"), out
    for part in ("read batches", "records", "epoch (read + records + steps)"):
        (line,) = [line for line in out.splitlines() if line.startswith(part)]
        assert re.search(r"old\s+[0-9.]+ ms\s+new\s+[0-9.]+ ms\s+x[0-9.]+", line), line
