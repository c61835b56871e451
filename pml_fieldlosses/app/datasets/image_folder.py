"""Your own images: one folder per class (``root/<class name>/<image files>``)."""

import warnings
from pathlib import Path

import numpy as np

from .base import ImageSet, first_half_split, render_files

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".svg")


def load_image_folder(root, image_size=64, workers=None):
    """Read ``root/<class>/<image>`` into an ImageSet. Classes are sorted by
    folder name; the first half are training classes, the rest test classes.
    Images are composited on white, padded to a square and resized. Classes
    with fewer than two images are skipped with a warning (they cannot be
    retrieved)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"--data folder {root} does not exist (expected one sub-folder per class)")
    paths, labels, names, skipped = [], [], [], []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS)
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
