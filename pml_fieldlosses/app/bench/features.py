"""What the runs train on: cached frozen-trunk features (memory-mapped, read
row by row), or images for a trunk that is trained.

The feature cache is written with plain writes and read back validated (header, size,
finite values) before it is memory-mapped: a full disk or a damaged file is named,
never a SIGBUS (docs/robustness.md)."""

import collections.abc
import copy
import errno
import io
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import tqdm

from .. import backbones
from ..datasets.augment import augment, to_float_nchw
from ..datasets.cache import build_lock, cache_dir, cache_faults
from ..errors import DAMAGED_ARRAY_FILE
from . import scheduler
from .protocol import number_of_workers

# bump when the features computed for the same inputs change
FEATURES_VERSION = 2
# images per feature-extraction job (fixed: the augmentation seeds depend on it)
CHUNK = 1024


def _row(array, row):
    return torch.from_numpy(np.array(array[row]))


class Samples(collections.abc.Sequence):
    """The samples of a batch read at once (a dataset's ``__getitems__``): the sequence of
    (input, label) that any collate function takes, held stacked (``stacked``), so that
    ``collate`` need not copy them again. A sample is made only when one is asked for
    (128 views of a batch's rows cost more than reading the batch)."""

    def __init__(self, inputs, labels):
        self.stacked = [inputs, labels]

    def __len__(self):
        return len(self.stacked[1])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        inputs, labels = self.stacked
        return inputs[i], labels[i]

    def __iter__(self):
        return zip(*(part.unbind(0) for part in self.stacked))


def collate(samples):
    """torch's default collation of (input, label) samples: [inputs, labels], each stacked
    (a batch read at once as it is)."""
    if isinstance(samples, Samples):
        return list(samples.stacked)
    return torch.utils.data.default_collate(samples)


class ViewsDataset(torch.utils.data.Dataset):
    """Training set of cached features with several views per sample: item i is
    ``views[v][rows[v][i]]`` for a view v drawn at random (global torch RNG, so
    seeded runs repeat).

    A DataLoader reads a whole batch at once (``__getitems__``): the views of its
    samples in one draw, which gives the same views and leaves the generator in the
    same state as one draw per sample, and the rows of each view in one read of the
    array, not one Python call per sample."""

    def __init__(self, views, rows, labels):
        self.views, self.rows = views, rows
        self.labels = torch.as_tensor(labels)

    def __len__(self):
        return len(self.rows[0])

    def __getitem__(self, i):
        view = torch.randint(len(self.views), ()).item()
        return _row(self.views[view], self.rows[view][i]), self.labels[i]

    def __getitems__(self, indices):
        indices = np.asarray(indices, dtype=np.int64)
        views = torch.randint(len(self.views), (len(indices),)).numpy()
        parts = [
            np.asarray(array[np.asarray(rows)[indices[views == v]]])
            for v, (array, rows) in enumerate(zip(self.views, self.rows))
        ]
        batch = np.empty((len(indices), *parts[0].shape[1:]), parts[0].dtype)
        for v, part in enumerate(parts):  # a loop over the views, not the samples
            batch[views == v] = part
        return Samples(torch.from_numpy(batch), self.labels[torch.from_numpy(indices)])


class ArrayDataset(torch.utils.data.Dataset):
    """(inputs[rows[i]], labels[i]): the rows of an array (features or images) that the
    split uses; a DataLoader reads a whole batch in one read (``__getitems__``)."""

    def __init__(self, inputs, rows, labels):
        self.inputs, self.rows = inputs, rows
        self.labels = torch.as_tensor(labels)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return _row(self.inputs, self.rows[i]), self.labels[i]

    def __getitems__(self, indices):
        indices = np.asarray(indices, dtype=np.int64)
        batch = np.asarray(self.inputs[np.asarray(self.rows)[indices]])
        return Samples(torch.from_numpy(batch), self.labels[torch.from_numpy(indices)])


def collate_images(batch, train):
    """uint8 HWC images -> float NCHW in [0, 255], augmented when ``train``."""
    images, labels = collate(batch)
    images = to_float_nchw(images)
    if train:
        images = augment(images, generator=None)
    return images, labels


def collate_train_images(batch):
    return collate_images(batch, train=True)


def collate_eval_images(batch):
    return collate_images(batch, train=False)


@dataclass
class Inputs:
    """The data of one benchmark, ready for the runs: the arrays (memory-mapped
    features, or the images) and the rows of each split in them."""

    split: object  # protocol.Split
    train_views: list  # [(array, rows)] one per view (one for images)
    eval_inputs: object  # array holding the val and test rows
    val_rows: np.ndarray
    test_rows: np.ndarray
    in_features: int
    make_trunk: Callable  # () -> trunk module (frozen Standardize, or a fresh trainable trunk)
    cached: bool  # the inputs are the cached outputs of the backbone's frozen part
    trunk_lr_multiplier: Optional[float] = None
    seed_independent: bool = True  # the untrained trunk is the same for every seed
    freeze_batchnorm: bool = False  # the trunk's BatchNorm keeps its running statistics
    trunk_warmup_epochs: int = 0  # the trunk is frozen for these first epochs
    train_collate: Optional[Callable] = None
    eval_collate: Optional[Callable] = None
    seconds: float = 0.0  # time spent computing features (0 when all came from the cache)

    def train_dataset(self, labels):
        arrays, rows = zip(*self.train_views)
        if self.cached:
            return ViewsDataset(arrays, rows, labels)
        return ArrayDataset(arrays[0], rows[0], labels)

    def eval_dataset(self, name):
        rows, labels = {
            "val": (self.val_rows, self.split.val_labels),
            "test": (self.test_rows, self.split.test_labels),
        }[name]
        return ArrayDataset(self.eval_inputs, rows, labels)


@torch.inference_mode()
def extract_features(trunk, images, device, batch_size=64, generator=None):
    """Features of uint8 (N, S, S, 3) ``images``, augmented with ``generator``
    if given. Small batches: on a CPU, 64 images go ~2x faster than 256."""
    trunk = trunk.to(device).eval()
    chunks = []
    for start in range(0, len(images), batch_size):
        batch = to_float_nchw(images[start : start + batch_size])
        if generator is not None:
            batch = augment(batch, generator)
        chunks.append(trunk(batch.to(device)).float().cpu())
    return torch.cat(chunks)


def view_generator(view, chunk_start):
    """None for the clean view 0; for view k >= 1 a generator seeded by (k,
    chunk): the views are the same whatever the number of workers."""
    return None if view == 0 else torch.Generator().manual_seed(view * 1_000_003 + chunk_start)


def chunk_features(shared, job, report=None):
    """Features of the CHUNK images of view ``job[0]`` from ``job[1]``."""
    trunk, images, rows_by_view, device, single_thread = shared
    view, start = job
    if single_thread:
        torch.set_num_threads(1)
    rows = rows_by_view[view][start : start + CHUNK]
    return extract_features(trunk, images[rows], device, generator=view_generator(view, start)).numpy()


def compute_views(trunk, images, rows_by_view, device, workers, file=None, out=None):
    """{view: features of images[rows_by_view[view]]}, in chunks of CHUNK
    images spread over ``workers`` single-threaded processes (on a CPU; they
    are robust to a busy machine, where one process with several threads is
    not), with one progress bar. ``out``: {view: array} to write into (e.g. a
    FeatureFile) instead of new arrays."""
    jobs = [(view, start) for view, rows in rows_by_view.items() for start in range(0, len(rows), CHUNK)]
    workers = workers if device.type == "cpu" else 1
    total = sum(len(rows) for rows in rows_by_view.values())
    views = out if out is not None else {}
    with tqdm.tqdm(total=total, desc="frozen features", unit="img", file=file, smoothing=0.1) as bar:

        def store(kind, job, features):
            if kind == "done":
                view, start = job
                if view not in views:
                    views[view] = np.empty((len(rows_by_view[view]), features.shape[1]), np.float32)
                views[view][start : start + len(features)] = features
                bar.update(len(features))

        tqdm.tqdm.monitor_interval = 0  # no monitor thread: nothing threaded to fork
        shared = (trunk.eval(), images, rows_by_view, device, workers > 1)
        scheduler.run_jobs(chunk_features, shared, jobs, workers, store, keep_results=False)
    return views


def npy_header(rows, width):
    """The header of a .npy file of a float32 (rows, width) C-order array, as np.save writes it."""
    buffer = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype("<f4")), "fortran_order": False}
    np.lib.format.write_array_header_1_0(buffer, {**header, "shape": (rows, width)})
    return buffer.getvalue()


def write_at(fd, offset, data):
    """Write all of ``data`` at ``offset`` of the open file ``fd``: a plain write, where a
    full disk is an OSError (ENOSPC), not a SIGBUS as in a memory-mapped file."""
    view = memoryview(data).cast("B")
    while view:
        if hasattr(os, "pwrite"):
            written = os.pwrite(fd, view, offset)
        else:  # no pwrite (Windows)
            os.lseek(fd, offset, os.SEEK_SET)
            written = os.write(fd, view)
        view, offset = view[written:], offset + written


def reserve(fd, size):
    """Allocate ``size`` bytes of disk to the open file ``fd`` now, so that a full disk is
    said before the features are computed, not after; where the system cannot reserve
    space (no posix_fallocate, or a file system without it) the writes still say it."""
    if not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
            raise


class FeatureFile:
    """float32 (rows, width) features written to ``path``, a .npy file, with plain
    writes (``file[start:stop] = features``), never through a memory map: a full disk
    is then a FileFault naming the file, not a SIGBUS that kills the process without a
    word. The disk space is reserved when the file is made; until ``commit`` (which
    moves the whole file into place) it is ``<stem>.part.npy`` beside ``path``, which
    ``discard`` removes."""

    def __init__(self, path, rows, width):
        self.path, self.rows, self.width = Path(path), rows, width
        self.part = self.path.with_name(f"{self.path.stem}.part.npy")
        self.fd = None
        header = npy_header(rows, width)
        self.offset = len(header)
        try:
            with self.faults():
                self.fd = os.open(self.part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
                write_at(self.fd, 0, header)
                reserve(self.fd, self.offset + rows * width * 4)
        except BaseException:
            self.discard()
            raise

    def faults(self):
        return cache_faults(self.path, "writing the cached features")

    def __setitem__(self, index, features):
        start, stop, _ = index.indices(self.rows)
        features = np.ascontiguousarray(features, dtype="<f4")
        if features.shape != (stop - start, self.width):
            raise ValueError(f"rows {start}:{stop} of {self.path} need shape ({stop - start}, {self.width})")
        with self.faults():
            write_at(self.fd, self.offset + start * self.width * 4, features)

    def commit(self):
        """Write the file to disk (fsync) and move it to ``path``; returns it memory-mapped."""
        with self.faults():
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = None
            os.replace(self.part, self.path)
        return np.memmap(self.path, np.float32, "r", self.offset, (self.rows, self.width))

    def discard(self):
        """Remove the unfinished file (after an error or an interrupt)."""
        try:
            if self.fd is not None:
                os.close(self.fd)
            self.part.unlink(missing_ok=True)
        except OSError:
            pass
        self.fd = None


def read_npy_header(path):
    """(shape, fortran order, dtype, size of the header, size of the file) of a .npy file."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version not in readers:
            raise ValueError(f"a .npy file of version {version}, expected 1.0 or 2.0")
        shape, fortran_order, dtype = readers[version](f)
        return shape, fortran_order, dtype, f.tell(), os.fstat(f.fileno()).st_size


def load_cached(path, rows, width):
    """The features cached in ``path``, memory-mapped, if it is a whole .npy file of
    finite float32 (rows, width), else None and the reason. The header and the size
    of the file are checked before it is mapped: a truncated file is never mapped
    (reading past its end would kill the process with a SIGBUS)."""
    if not path.exists():
        return None, None
    try:
        shape, fortran_order, dtype, offset, size = read_npy_header(path)
    except DAMAGED_ARRAY_FILE as e:
        return None, f"unreadable ({type(e).__name__}: {e})"
    if dtype != np.float32 or fortran_order or shape != (rows, width):
        return None, f"{dtype} {shape}, expected float32 ({rows}, {width})"
    expected = offset + rows * width * 4
    if size != expected:
        return None, f"{size} bytes, expected {expected}: truncated or damaged"
    try:
        features = np.memmap(path, np.float32, "r", offset, (rows, width))
    except (OSError, ValueError) as e:
        return None, f"unreadable ({e})"
    for start in range(0, rows, 4096):
        if not np.isfinite(features[start : start + 4096]).all():
            return None, "non-finite values"
    return features, None


def cached_views(dataset, rows_by_view, config, file=None):
    """{view: memory-mapped features} of ``dataset.images[rows]`` for each view,
    computed once per data set and cached under ``<cache>/features/``; a bad cache
    file (damaged, truncated, of another shape) is named and recomputed. A fault of the
    file system (a full disk, a read-only cache) is a FileFault naming the file and
    what to do; the space of the files to compute is reserved before computing them.
    The features are the outputs of the frozen part of ``config.backbone``, cached per
    backbone cut (its ``cache_tag``). Returns (views, frozen part, seconds spent computing)."""
    backbone = backbones.get_backbone(config.backbone)
    folder = cache_dir(config.cache) / "features"
    folder = folder / f"{dataset.name}-{dataset.fingerprint()}-{backbone.cache_tag}-v{FEATURES_VERSION}"
    with build_lock(folder):
        trunk = backbones.build_frozen_part(config.backbone, dataset.image_size)
        views, missing = {}, {}
        for view, rows in rows_by_view.items():
            path = folder / f"view{view}.npy"
            views[view], problem = load_cached(path, len(rows), trunk.out_features)
            if views[view] is None:
                missing[view] = rows
                if problem:
                    print(f"cached features {path} are bad ({problem}): computing them again", file=file)
        if not missing:
            return views, trunk, 0.0
        start = time.perf_counter()
        with cache_faults(folder, "making the feature cache folder"):
            folder.mkdir(parents=True, exist_ok=True)
        parts = {}
        try:
            for view, rows in missing.items():
                parts[view] = FeatureFile(folder / f"view{view}.npy", len(rows), trunk.out_features)
            workers = number_of_workers(config, len(missing) * 100)
            device = torch.device(config.device)
            compute_views(trunk, dataset.images, missing, device, workers, file, out=parts)
            for view, part in parts.items():
                views[view] = part.commit()
        finally:
            for part in parts.values():
                part.discard()  # the uncommitted ones (after an error or an interrupt)
        return views, trunk, time.perf_counter() - start


def standardizer(trunk, inputs, rows, collate_fn, batch_size=256):
    """A Standardize fitted on the features that ``trunk`` (eval mode, no gradient) gives
    for ``inputs[rows]``: the untrained trunk's statistics on the training split."""
    loader = torch.utils.data.DataLoader(
        ArrayDataset(inputs, rows, np.zeros(len(rows), np.int64)), batch_size, collate_fn=collate_fn
    )
    device = next(trunk.parameters()).device
    trunk.eval()
    with torch.inference_mode():
        features = torch.cat([trunk(batch.to(device)).float().cpu() for batch, _ in loader])
    return backbones.Standardize(features, trunk.tap_sizes)


def prepare_inputs(dataset, split, config, file=None):
    """Inputs for the runs. A backbone with a frozen part: its outputs for every image
    (clean) and ``config.aug_views`` augmented views of the training-class images, cached
    (features.cached_views); else the images, augmented on the fly for training. A
    ``standardized`` backbone ends with a fixed Standardize fitted on the untrained trunk's
    features of the training split; the part that trains (if any) is built fresh per run."""
    file = file or sys.stderr
    backbone = backbones.get_backbone(config.backbone)
    common = dict(split=split, val_rows=split.val, test_rows=split.test)
    common.update(
        trunk_lr_multiplier=backbone.trunk_lr_multiplier,
        seed_independent=backbone.seed_independent,
        freeze_batchnorm=backbone.freeze_batchnorm,
        trunk_warmup_epochs=backbone.trunk_warmup_epochs,
    )
    if backbone.frozen_part is not None:
        train_class_rows = np.flatnonzero(dataset.is_train())
        rows_by_view = {0: np.arange(len(dataset.images))}
        rows_by_view.update({view: train_class_rows for view in range(1, config.aug_views + 1)})
        features, frozen_part, seconds = cached_views(dataset, rows_by_view, config, file)
        clean = features[0]
        position = np.searchsorted(train_class_rows, split.train)
        views = [(clean, split.train)] + [(features[v], position) for v in range(1, config.aug_views + 1)]
        inputs = dict(train_views=views, eval_inputs=clean, cached=True, seconds=seconds)
        inputs.update(train_collate=collate, eval_collate=collate)
    else:
        inputs = dict(train_views=[(dataset.images, split.train)], eval_inputs=dataset.images, cached=False)
        inputs.update(train_collate=collate_train_images, eval_collate=collate_eval_images)
    if backbone.trained_part is None:  # frozen: the cached features, standardised
        standardize = backbones.Standardize(torch.from_numpy(clean[split.train]), frozen_part.tap_sizes)
        return Inputs(in_features=clean.shape[1], make_trunk=lambda: standardize, **inputs, **common)

    def trained_part():
        return backbones.build_trunk(config.backbone, dataset.image_size)

    probe = trained_part().to(torch.device(config.device))
    if not backbone.standardized:
        return Inputs(in_features=probe.out_features, make_trunk=trained_part, **inputs, **common)
    standardize = standardizer(probe, inputs["eval_inputs"], split.train, inputs["eval_collate"])
    return Inputs(
        in_features=probe.out_features,
        make_trunk=lambda: torch.nn.Sequential(trained_part(), copy.deepcopy(standardize)),
        **inputs,
        **common,
    )
