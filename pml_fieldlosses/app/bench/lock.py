"""One command at a time in a results folder.

``bench``, ``select`` and ``claims`` hold every results folder they write in (and the
claims' report folder) for as long as they run: an exclusive ``fcntl.flock`` on the
folder's ``.lock`` file, which holds the process id of the command. A second command on
the same folder stops at once, before loading any data, with one line naming the folder
and the process that holds it (a FileFault, exit 1): two commands never train the same
run twice nor mix their files. Commands on different folders (other settings, another
``--out``) run side by side. The operating system releases the lock when the process ends,
however it ends, so a killed command leaves no stale lock (the file may stay; it is not
read back as a lock). Where the file system cannot lock (a few network file systems) a
warning says so and the command goes on unguarded; on a system without ``fcntl``
(Windows) there is no lock.
"""

import contextlib
import errno
import os
import sys
from pathlib import Path

from ..errors import FileFault, file_fault

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK_FILE = ".lock"


@contextlib.contextmanager
def hold_folders(folders, file=None):
    """Hold every folder of ``folders`` (created if needed) for the block; a FileFault
    naming the folder and the process holding it if another command holds one."""
    with contextlib.ExitStack() as stack:
        for folder in dict.fromkeys(Path(f) for f in folders):
            stack.enter_context(_hold(folder, file))
        yield


@contextlib.contextmanager
def _hold(folder, file):
    path = folder / LOCK_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise file_fault(e, path, "locking the results folder") from e
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    print(
                        f"warning: cannot lock {folder} ({e.strerror}): run one command at a time on it",
                        file=file or sys.stderr,
                    )
                else:
                    raise FileFault(
                        f"{folder} is in use by another pml-fieldlosses command (process {holder(fd)}): "
                        "wait for it to end, or choose another --out"
                    ) from None
            else:
                write_pid(fd, path)
        yield
    finally:
        os.close(fd)


def write_pid(fd, path):
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:
        raise file_fault(e, path, "locking the results folder") from e


def holder(fd):
    """The process id written in the lock file ``fd``, as text ("unknown" when there is none yet)."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return text if text.isdigit() else "unknown"
