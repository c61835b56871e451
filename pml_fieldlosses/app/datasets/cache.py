"""Where built data sets and cached features live."""

import contextlib
import os
import sys
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no lock (one process per cache)
    fcntl = None

CACHE_ENV_VAR = "PML_FIELDLOSSES_CACHE"


def cache_dir(override=None):
    """The cache root: ``override`` if given, else $PML_FIELDLOSSES_CACHE, else
    the user cache directory (e.g. ~/.cache/pml-fieldlosses on Linux)."""
    if override is None:
        override = os.environ.get(CACHE_ENV_VAR) or None
    if override is None:
        import platformdirs

        override = platformdirs.user_cache_dir("pml-fieldlosses", appauthor=False)
    path = Path(override).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def build_lock(path):
    """Hold an exclusive lock on ``<path>.lock`` while a cache entry is checked and, if
    missing, built: processes that share a cache (the bench's workers, pb's Ray trials)
    build an entry once and never read one half-written. Waiting for another process's
    build is said on stderr (a build can take minutes: a silent wait looks like a hang)."""
    lock_path = Path(f"{path}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        if fcntl is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(
                    f"waiting for another process that is building {path} (lock {lock_path})",
                    file=sys.stderr,
                    flush=True,
                )
                fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)
