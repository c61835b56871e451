"""What the powerful-benchmarker tests share: skipping when pb's stack or npm is absent."""

import importlib.util
import shutil

import pytest


def pb_skip(*modules):
    """(the missing modules of ``modules``, a skip mark for a test module that needs them)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    mark = pytest.mark.skipif(
        bool(missing),
        reason=f"the pb integration needs {', '.join(missing)} (not installed): pip install "
        "'pml-fieldlosses[pb]' and pip install --no-deps powerful-benchmarker==0.9.33, see docs/benchmarker.md",
    )
    return missing, mark


def npm_skip():
    """A skip mark for tests on the emoji data where npm (which builds it) is missing."""
    return pytest.mark.skipif(
        shutil.which("npm") is None, reason="the emoji data is built with npm (not found): install Node.js"
    )
