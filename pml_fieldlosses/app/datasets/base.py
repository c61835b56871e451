"""An in-memory labelled image set with a class-disjoint train/test split."""

import hashlib
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import tqdm

from ..errors import DAMAGED_ARRAY_FILE, atomic_write, file_fault
from .render import render_file


@dataclass
class ImageSet:
    """``images`` (N, S, S, 3) uint8 RGB; ``labels`` (N,) int64 class indices;
    ``class_names`` one per class; ``sources`` (N,) where each image came from
    (vendor or file). Classes ``[0, num_train_classes)`` are the training
    classes, the rest the test classes."""

    images: np.ndarray
    labels: np.ndarray
    class_names: np.ndarray
    sources: np.ndarray
    num_train_classes: int
    name: str = "images"

    def __post_init__(self):
        self.images = np.asarray(self.images, dtype=np.uint8)
        self.labels = np.asarray(self.labels, dtype=np.int64)
        self.class_names = np.asarray(self.class_names, dtype=str)
        self.sources = np.asarray(self.sources, dtype=str)
        n = len(self.images)
        if self.images.ndim != 4 or self.images.shape[3] != 3 or self.images.shape[1] != self.images.shape[2]:
            raise ValueError(f"images must have shape (N, S, S, 3), got {self.images.shape}")
        if self.labels.shape != (n,) or self.sources.shape != (n,):
            raise ValueError("labels and sources need one entry per image")
        if n and (self.labels.min() < 0 or self.labels.max() >= len(self.class_names)):
            raise ValueError("labels must index class_names")
        if not 0 < self.num_train_classes < len(self.class_names):
            raise ValueError(
                f"num_train_classes must be in (0, {len(self.class_names)}), got {self.num_train_classes}"
            )

    @property
    def num_classes(self):
        return len(self.class_names)

    @property
    def image_size(self):
        return self.images.shape[1]

    def is_train(self):
        """Boolean mask of the images of the training classes."""
        return self.labels < self.num_train_classes

    def fingerprint(self):
        """A short content hash (images, labels, split), used to key cached features."""
        digest = hashlib.sha256()
        for array in (self.images, self.labels, np.array([self.num_train_classes])):
            digest.update(np.ascontiguousarray(array))  # the buffer itself: no copy of the images
        return digest.hexdigest()[:16]

    def save(self, path):
        """Write a compressed .npz whole or not at all (``errors.atomic_write``: a failed
        write leaves the previous file or none); an OSError is a FileFault naming ``path``."""
        with atomic_write(path, "wb", doing="writing the image set") as f:
            np.savez_compressed(
                f,
                images=self.images,
                labels=self.labels,
                class_names=self.class_names,
                sources=self.sources,
                num_train_classes=np.array(self.num_train_classes),
                name=np.array(self.name),
            )

    @classmethod
    def load(cls, path):
        """The ImageSet saved in ``path``: a FileFault names it if it cannot be opened, a
        ValueError if it is not a saved image set (damaged, truncated, other arrays)."""
        try:
            file = open(path, "rb")
        except OSError as e:
            raise file_fault(e, path, "reading the saved image set") from e
        try:
            with file, np.load(file, allow_pickle=False) as data:
                return cls(
                    images=data["images"],
                    labels=data["labels"],
                    class_names=data["class_names"],
                    sources=data["sources"],
                    num_train_classes=int(data["num_train_classes"]),
                    name=str(data["name"]),
                )
        except DAMAGED_ARRAY_FILE as e:
            raise ValueError(
                f"{path} is not a saved image set ({e!r}); delete it (rm '{path}') to rebuild"
            ) from None


def first_half_split(num_classes):
    """Number of training classes: the first half (the standard benchmarks' rule)."""
    if num_classes < 4:
        raise ValueError(f"need at least 4 classes for a train/test split by class, got {num_classes}")
    return num_classes // 2


def _render_one(job):
    path, size = job
    return render_file(path, size)


def render_files(paths, size, workers=None, desc="rendering"):
    """Render files to a (N, size, size, 3) array, in parallel processes, with a progress bar."""
    workers = workers or os.cpu_count() or 1
    images = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    jobs = [(str(p), size) for p in paths]
    bar = dict(total=len(jobs), desc=desc, unit="img", leave=False)
    if workers == 1 or len(jobs) < 64:
        for i, job in enumerate(tqdm.tqdm(jobs, **bar)):
            images[i] = _render_one(job)
        return images
    with ProcessPoolExecutor(workers) as pool:
        results = pool.map(_render_one, jobs, chunksize=64)
        for i, image in enumerate(tqdm.tqdm(results, **bar)):
            images[i] = image
    return images
