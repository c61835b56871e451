"""The tests that take their dtypes from TEST_DTYPES (PML's convention; a GPU run uses
TEST_DTYPES=float16,float32,float64) pass with float16 too. Every CI run checks it here, on
the CPU, in a subprocess: a half-precision expectation that no default run exercises (a
loss computed in float32 for half inputs, say) cannot rot unseen until a GPU run."""

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# the files that read TEST_DTYPES (through tests/helpers.py or tests/__init__.py), but not
# the upstream kit's tests, which pass their own TEST_DTYPES to PML's suite
NOT_HERE = {"__init__.py", "helpers.py", "test_upstream.py", Path(__file__).name}


def dtype_test_files():
    files = sorted(TESTS.glob("test_*.py")) + sorted((TESTS / "losses").glob("*.py"))
    return [
        str(path.relative_to(TESTS.parent))
        for path in files
        if path.name not in NOT_HERE and "DTYPES" in path.read_text()
    ]


def test_the_dtype_tests_pass_in_float16():
    files = dtype_test_files()
    assert "tests/test_potential_field_loss.py" in files and "tests/losses/exactness.py" in files
    environment = dict(os.environ, TEST_DTYPES="float16", TEST_DEVICE="cpu")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        cwd=TESTS.parent,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
