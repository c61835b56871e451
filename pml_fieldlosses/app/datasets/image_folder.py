"""Your own images: one folder per class (``root/<class name>/<image files>``)."""

import warnings
from pathlib import Path

import numpy as np

from ..errors import FileFault, file_fault
from .base import ImageSet, first_half_split, render_files

IMAGE_EXTENSIONS = (
    ".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".pbm", ".pgm", ".ppm", ".pnm", ".svg"
)  # fmt: skip


def entries(folder, keep, doing):
    """The entries of ``folder`` that ``keep`` (path -> bool), sorted; a folder or an
    entry that cannot be read is a FileFault naming it."""
    try:
        return sorted(p for p in folder.iterdir() if keep(p))
    except OSError as e:
        raise file_fault(e, e.filename or folder, doing) from e


def is_class_folder(path):
    return path.is_dir() and not path.name.startswith(".")


def is_image_file(path):
    return path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS


def load_image_folder(root, image_size=64, workers=None):
    """Read ``root/<class>/<image>`` into an ImageSet. Classes are sorted by
    folder name; the first half are training classes, the rest test classes.
    Images are read as render.py says (any mode and bit depth, the first frame,
    upright), composited on white, padded to a square and resized. Classes with
    fewer than two images are skipped with a warning (they cannot be retrieved).
    A folder or image that cannot be read is a FileFault naming it, a file that is
    not an image a ValueError naming it."""
    root = Path(root)
    try:
        found = root.is_dir()
    except OSError as e:
        raise file_fault(e, root, "reading the --data folder") from e
    if not found:
        if root.exists():
            raise FileFault(f"--data {root}: it is a file, not a folder (expected one sub-folder per class)")
        raise FileNotFoundError(f"--data folder {root} does not exist (expected one sub-folder per class)")
    paths, labels, names, skipped = [], [], [], []
    for folder in entries(root, is_class_folder, "reading the --data folder"):
        files = entries(folder, is_image_file, "reading the class folder")
        if len(files) < 2:
            skipped.append(folder.name)
            continue
        paths += files
        labels += [len(names)] * len(files)
        names.append(folder.name)
    if skipped:
        warnings.warn(
            f"skipped {len(skipped)} class folder(s) with fewer than 2 images: {skipped[:5]}", stacklevel=2
        )
    if len(names) < 4:
        raise ValueError(
            f"{root} has {len(names)} class folders with at least 2 images ({IMAGE_EXTENSIONS}); "
            "the benchmark needs at least 4 (half for training, half for testing)"
        )
    images = render_files(paths, image_size, workers, desc=f"reading {root.name}")
    sources = [p.relative_to(root).as_posix() for p in paths]
    return ImageSet(
        images, np.array(labels), np.array(names), np.array(sources), first_half_split(len(names)), root.name
    )
