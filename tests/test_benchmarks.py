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
