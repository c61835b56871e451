"""All-or-nothing writing of the kit's files into a checkout.

The kit computes every file it writes before writing any (``kit.plan``); ``write_all``
then writes them so that a failure at any point (a read-only folder, a full disk, no
permission, Ctrl-C) leaves the checkout byte-identical to before:

1. check every target: its nearest existing folder is a writable folder, and a target that
   exists is a writable file;
2. create the missing folders; write each new text to a temporary file beside its target,
   and a copy of each existing target's original beside it;
3. ``os.replace`` each temporary file onto its target;
4. remove the copies of the originals.

A failure in 2 or 3 undoes everything done so far, in reverse: the temporary files are
removed, each replaced target gets its original back (a rename of its copy, which needs no
space), each new file is removed, the created folders are removed. The error is a
``FileFault`` naming the path and what to do.
"""

import errno
import os
import secrets
import stat
from pathlib import Path

from ..errors import FileFault, file_fault

UNCHANGED = "the checkout is unchanged"


def write_all(files):
    """Write ``files`` ({path: text}, UTF-8) all or none; a FileFault names the path."""
    files = {Path(path): text.encode("utf-8") for path, text in files.items()}
    for path in files:
        check_writable(path)
    undo = Undo()
    at = None
    try:
        for path, data in files.items():
            at = path
            for folder in missing_folders(path.parent):
                at = folder
                os.mkdir(folder)
                undo.folders.append(folder)
            at = path
            mode = None
            if os.path.lexists(path):
                mode = stat.S_IMODE(os.stat(path).st_mode)
                undo.originals[path] = create(sibling(path, "orig"), path.read_bytes(), mode)
            undo.temporaries[path] = create(sibling(path, "tmp"), data, mode)
        for path in files:
            at = path
            undo.replaced.append(path)  # before the replace: an interrupt just after it is undone too
            try:
                os.replace(undo.temporaries[path], path)
            except OSError:
                undo.replaced.pop()
                raise
            del undo.temporaries[path]
    except BaseException as error:
        left = undo.run()
        state = UNCHANGED if not left else f"could not undo {', '.join(left)}: restore them"
        if isinstance(error, OSError):
            raise FileFault(f"{file_fault(error, at, 'writing')}; {state}") from error
        if left:  # e.g. Ctrl-C, then a failure of the undo
            raise FileFault(f"interrupted while writing {at}; {state}") from error
        raise
    for path, original in undo.originals.items():
        try:
            os.unlink(original)
        except OSError as error:
            raise FileFault(
                f"{file_fault(error, original, 'removing')}; the kit's files are written: remove {original}"
            ) from error


class Undo:
    """What write_all has done so far, and how to take it back."""

    def __init__(self):
        self.folders = []  # created, in order
        self.originals = {}  # target -> the copy of its original
        self.temporaries = {}  # target -> its new text, not yet in place
        self.replaced = []  # targets in place, in order

    def run(self):
        """Take back everything; returns what it could not take back, in words."""
        left = []
        for temporary in self.temporaries.values():
            remove(temporary, left)
        for path in reversed(self.replaced):
            if path not in self.originals:
                remove(path, left)
                continue
            try:
                os.replace(self.originals[path], path)
                del self.originals[path]
            except OSError:
                left.append(f"{path} (its original is {self.originals.pop(path)})")
        for original in self.originals.values():
            remove(original, left)
        for folder in reversed(self.folders):
            try:
                os.rmdir(folder)
            except OSError:
                left.append(str(folder))
        return left


def remove(path, left):
    """Remove the file ``path`` if it is there; add it to ``left`` if it cannot be removed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        left.append(str(path))


def check_writable(path):
    """A FileFault unless ``path`` can be written: its nearest existing folder is a
    writable folder, and ``path``, if it exists, a writable file."""
    folder = path.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise refusal(errno.ENOTDIR, folder)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise refusal(errno.EROFS if read_only(folder) else errno.EACCES, folder)
    if os.path.lexists(path):
        if not path.is_file() or path.is_symlink():
            raise refusal(errno.EISDIR if path.is_dir() else errno.EEXIST, path)
        if not os.access(path, os.W_OK):
            raise refusal(errno.EROFS if read_only(folder) else errno.EACCES, path)


def refusal(number, path):
    return FileFault(f"{file_fault(OSError(number, os.strerror(number)), path, 'writing')}; {UNCHANGED}")


def read_only(folder):
    """Whether ``folder`` is on a file system mounted read-only (False where unknown)."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (AttributeError, OSError):
        return False


def missing_folders(folder):
    """The folders above and at ``folder`` that do not exist, outermost first."""
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing[::-1]


def sibling(path, kind):
    """A fresh name beside ``path`` for a temporary file of the kit."""
    return path.with_name(f".{path.name}.upstream-kit-{secrets.token_hex(4)}.{kind}")


def create(path, data, mode=None):
    """Write ``data`` to the new file ``path`` (flushed to disk), with permissions ``mode``
    (None: as a new file gets them); on any error the file is removed. Returns ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if mode is not None:
            os.chmod(path, mode)
    except BaseException:
        remove(path, [])
        raise
    return path
