"""The errors a user can cause, and how the commands report them.

Two kinds, each shown as one line instead of a traceback (``--traceback`` shows it):

* ``UsageError``: an option or a configuration value the command cannot take. The line
  names the option and what is accepted; the command exits with 2, like argparse.
* ``FileFault``: the file system refused something (a folder that is a file, no
  permission, a full disk, a read-only folder). The line names the path, what the
  command was doing and what to do; the command exits with 1. ``file_fault`` makes one
  from an ``OSError``.

Options are checked when the command line is parsed, with the argparse types below, so a
bad value never starts a run. Files are written whole or not at all (``atomic_write``):
a killed or failed write leaves the previous file (or none), never half of one.
"""

import argparse
import errno
import math
import os
import secrets
import stat
import tempfile
import tokenize
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path


# what numpy raises reading a damaged .npy or .npz file: its header parser meets bytes it
# cannot parse (SyntaxError, tokenize.TokenError, RecursionError on deep nesting, ValueError),
# a size it cannot allocate (MemoryError), a damaged or cut archive (BadZipFile, zlib.error,
# EOFError), a missing array (KeyError)
DAMAGED_ARRAY_FILE = (
    OSError,
    ValueError,
    TypeError,
    KeyError,
    EOFError,
    SyntaxError,
    tokenize.TokenError,
    RecursionError,
    MemoryError,
    zipfile.BadZipFile,
    zlib.error,
)


class UsageError(ValueError):
    """An option or configuration value the command cannot take (exit 2)."""


class FileFault(RuntimeError):
    """A file-system fault, named with its path and what to do (exit 1)."""


# What to do, by errno; the others get the system's own words.
ADVICE = {
    errno.ENOSPC: "the disk is full: free space or choose a folder on another disk",
    errno.EDQUOT: "the disk quota is exhausted: free space or choose a folder on another disk",
    errno.EROFS: "the file system is read-only: choose a writable folder",
    errno.EACCES: "permission denied: fix the permissions or choose another folder",
    errno.EPERM: "operation not permitted: fix the permissions or choose another folder",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
    errno.EISDIR: "it is a folder where a file was expected: choose another path",
    errno.EEXIST: "something else is already there: move it away or choose another path",
    errno.ENAMETOOLONG: "the path is too long: choose a shorter one",
}


def file_fault(error, path, doing):
    """A FileFault for ``error`` (an OSError) met while ``doing`` (e.g. "writing the report")
    at ``path``."""
    advice = ADVICE.get(error.errno) or (error.strerror or str(error))
    return FileFault(f"{doing} {path}: {advice}")


@contextmanager
def atomic_write(path, mode="w", doing="writing"):
    """Open a temporary file beside ``path`` for writing; on success it replaces ``path``
    in one step (``os.replace``), on any error it is removed and ``path`` is left as it
    was. The file keeps the mode of the one it replaces (a new one gets the usual 0o666
    less the umask). An OSError becomes a FileFault naming ``path``."""
    path = Path(path)
    tmp = None
    try:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        if path.exists():
            os.chmod(fd, stat.S_IMODE(path.stat().st_mode))
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise file_fault(e, path, doing) from e
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def writable_folder(path, option):
    """Create ``path`` (a folder) if needed and check that files can be written in it;
    a FileFault names ``option`` and the path otherwise."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileFault(f"{option} {path}: it is a file, not a folder: choose another path")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-check.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise file_fault(e, path, f"{option}: cannot write in") from e
    return path


def int_range(low=None, high=None):
    """An argparse type: an integer in [low, high] (either bound may be None)."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer{_bounds(low, high)}, got {text!r}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected an integer{_bounds(low, high)}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def float_range(low=None, high=None, low_open=False, high_open=False):
    """An argparse type: a finite number in the interval from low to high (each end closed
    unless ``*_open``; either bound may be None)."""

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        below = low is not None and (value <= low if low_open else value < low)
        above = high is not None and (value >= high if high_open else value > high)
        if not math.isfinite(value) or below or above:
            interval = _interval(low, high, low_open, high_open)
            raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def _bounds(low, high):
    if low is not None and high is not None:
        return f" from {low} to {high}"
    if low is not None:
        return f" >= {low}"
    if high is not None:
        return f" <= {high}"
    return ""


def _interval(low, high, low_open, high_open):
    left = "(" if low_open or low is None else "["
    right = ")" if high_open or high is None else "]"
    return f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
