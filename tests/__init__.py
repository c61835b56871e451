"""Our test suite. As in PML's tests/__init__.py, the PML-style test files of tests/losses/
read the dtypes and the device to run in from here: TEST_DTYPES (comma-separated, default
float32,float64) and TEST_DEVICE (default cpu) from the environment."""

from .helpers import DEVICE as TEST_DEVICE
from .helpers import DTYPES as TEST_DTYPES

__all__ = ["TEST_DEVICE", "TEST_DTYPES"]
