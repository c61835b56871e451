"""Where built data sets and cached features live, and how a fault there is said.

Every fault of the file system met in the cache (a full disk, a read-only or unreadable
folder, a cache path that is a file) is a ``FileFault`` that names the path, says what
to do, and says where another cache folder is chosen (``--cache`` or
$PML_FIELDLOSSES_CACHE); see docs/robustness.md."""

import contextlib
import os
import sys
from pathlib import Path

from ..errors import FileFault, file_fault

try:
    import fcntl
except ImportError:  # not POSIX: no lock (one process per cache)
    fcntl = None

CACHE_ENV_VAR = "PML_FIELDLOSSES_CACHE"
# added to every fault in the cache: the other way out than fixing the folder
ELSEWHERE = f"another cache folder is chosen with --cache or ${CACHE_ENV_VAR}"


def cache_fault(error, path, doing):
    """The FileFault of ``error`` (an OSError) met while ``doing`` at ``path`` in the cache."""
    return FileFault(f"{file_fault(error, path, doing)} ({ELSEWHERE})")


@contextlib.contextmanager
def cache_faults(path, doing):
    """Turn an OSError raised inside into a cache FileFault that names the file of the
    error (else ``path``); a FileFault raised inside (``errors.atomic_write``) gets the
    cache's ``ELSEWHERE`` too."""
    try:
        yield
    except FileFault as e:
        if ELSEWHERE in str(e):
            raise
        raise FileFault(f"{e} ({ELSEWHERE})") from e.__cause__
    except OSError as e:
        raise cache_fault(e, e.filename or path, doing) from e


def cache_dir(override=None):
    """The cache root: ``override`` if given, else $PML_FIELDLOSSES_CACHE, else
    the user cache directory (e.g. ~/.cache/pml-fieldlosses on Linux), created if
    needed. A FileFault names it if it is a file or cannot be created."""
    if override is None:
        override = os.environ.get(CACHE_ENV_VAR) or None
    if override is None:
        import platformdirs

        override = platformdirs.user_cache_dir("pml-fieldlosses", appauthor=False)
    path = Path(override).expanduser().resolve()
    with cache_faults(path, "creating the cache folder"):
        if path.exists() and not path.is_dir():
            raise FileFault(
                f"cache folder {path}: it is a file, not a folder: choose another path ({ELSEWHERE})"
            )
        path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def build_lock(path):
    """Hold an exclusive lock on ``<path>.lock`` while a cache entry is checked and, if
    missing, built: processes that share a cache (the bench's workers, pb's Ray trials)
    build an entry once and never read one half-written. Waiting for another process's
    build is said on stderr (a build can take minutes: a silent wait looks like a hang).
    A lock that cannot be made (a read-only cache) is a FileFault naming it."""
    lock_path = Path(f"{path}.lock")
    with cache_faults(lock_path, "locking the cache entry"):
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a")
    with handle:
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
