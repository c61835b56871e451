"""What the runs train on: cached frozen-trunk features, or images for a trunk
that is trained."""

import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
import tqdm

from .. import backbones
from ..datasets.augment import augment, to_float_nchw
from ..datasets.cache import cache_dir
from .protocol import number_of_workers

# bump when the features computed for the same inputs change
FEATURES_VERSION = 2
# images per feature-extraction job (fixed: the augmentation seeds depend on it)
CHUNK = 1024


class ViewsDataset(torch.utils.data.Dataset):
    """Training set of cached features with several views per sample: item i is
    a view drawn at random (global torch RNG, so seeded runs repeat)."""

    def __init__(self, views, labels):
        self.views = views  # (V, N, F)
        self.labels = torch.as_tensor(labels)

    def __len__(self):
        return self.views.shape[1]

    def __getitem__(self, i):
        view = torch.randint(self.views.shape[0], ()).item()
        return self.views[view, i], self.labels[i]


class ArrayDataset(torch.utils.data.Dataset):
    """(inputs[i], labels[i]) pairs of two aligned tensors."""

    def __init__(self, inputs, labels):
        self.inputs = inputs
        self.labels = torch.as_tensor(labels)

    def __len__(self):
        return len(self.inputs)

    def __getitem__(self, i):
        return self.inputs[i], self.labels[i]


def collate_images(batch, train):
    """uint8 HWC images -> float NCHW in [0, 255], augmented when ``train``."""
    images = to_float_nchw(torch.stack([item[0] for item in batch]))
    labels = torch.stack([item[1] for item in batch])
    if train:
        images = augment(images, generator=None)
    return images, labels


def collate_train_images(batch):
    return collate_images(batch, train=True)


def collate_eval_images(batch):
    return collate_images(batch, train=False)


@dataclass
class Inputs:
    """The data of one benchmark, ready for the runs."""

    split: object  # protocol.Split
    train_inputs: torch.Tensor  # (V, N_train, F) features, or (N_train, S, S, 3) uint8 images
    val_inputs: torch.Tensor
    test_inputs: torch.Tensor
    in_features: int
    make_trunk: Callable  # () -> trunk module (frozen Standardize, or a fresh trainable trunk)
    frozen: bool
    trunk_lr_multiplier: float = 1.0
    train_collate: Optional[Callable] = None
    eval_collate: Optional[Callable] = None
    seconds: float = 0.0  # time spent computing features (0 when all came from the cache)

    def train_dataset(self, labels):
        if self.frozen:
            return ViewsDataset(self.train_inputs, labels)
        return ArrayDataset(self.train_inputs, labels)

    def eval_dataset(self, name):
        split = self.split
        inputs, labels = {
            "val": (self.val_inputs, split.val_labels),
            "test": (self.test_inputs, split.test_labels),
        }[name]
        return ArrayDataset(inputs, labels)


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


# what forked feature workers read (copy-on-write)
_SHARED = {}


def chunk_features(trunk, images, rows_by_view, view, start, device):
    """Features of the CHUNK images of ``view`` from ``start``."""
    rows = rows_by_view[view][start : start + CHUNK]
    return extract_features(trunk, images[rows], device, generator=view_generator(view, start)).numpy()


def _chunk_features(job):
    torch.set_num_threads(1)
    return chunk_features(_SHARED["trunk"], _SHARED["images"], _SHARED["rows"], *job, torch.device("cpu"))


def compute_views(trunk, images, rows_by_view, device, workers, file=None):
    """{view: features of images[rows_by_view[view]]}, in chunks of CHUNK
    images spread over ``workers`` single-threaded processes (on a CPU; they
    are robust to a busy machine, where one process with several threads is
    not), with one progress bar."""
    jobs = [(view, start) for view, rows in rows_by_view.items() for start in range(0, len(rows), CHUNK)]
    done = {}
    total = sum(len(rows) for rows in rows_by_view.values())
    with tqdm.tqdm(total=total, desc="frozen features", unit="img", file=file, smoothing=0.1) as bar:
        if workers <= 1 or device.type != "cpu":
            for view, start in jobs:
                done[(view, start)] = chunk_features(trunk, images, rows_by_view, view, start, device)
                bar.update(len(done[(view, start)]))
        else:
            tqdm.tqdm.monitor_interval = 0  # no monitor thread: nothing threaded to fork
            _SHARED.update(trunk=trunk.eval(), images=images, rows=rows_by_view)
            try:
                with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                    futures = {pool.submit(_chunk_features, job): job for job in jobs}
                    for future in as_completed(futures):
                        done[futures[future]] = future.result()
                        bar.update(len(done[futures[future]]))
            finally:
                _SHARED.clear()
    return {
        view: np.concatenate([done[(view, start)] for start in range(0, len(rows), CHUNK)])
        for view, rows in rows_by_view.items()
    }


def cached_views(dataset, rows_by_view, config, file=None):
    """{view: features} of ``dataset.images[rows]`` for each view, computed once
    per data set and cached under ``<cache>/features/``. Returns (views, trunk,
    seconds spent computing)."""
    folder = cache_dir(config.cache) / "features"
    folder = folder / f"{dataset.name}-{dataset.fingerprint()}-lite0-v{FEATURES_VERSION}"
    views, missing = {}, {}
    for view, rows in rows_by_view.items():
        path = folder / f"view{view}.npy"
        features = np.load(path) if path.is_file() else None
        if features is not None and features.shape[0] == len(rows):
            views[view] = torch.from_numpy(features)
        else:
            missing[view] = rows
    trunk = backbones.build_trunk(config.backbone, dataset.image_size)
    if not missing:
        return views, trunk, 0.0
    start = time.perf_counter()
    workers = number_of_workers(config, len(missing) * 100)
    computed = compute_views(trunk, dataset.images, missing, torch.device(config.device), workers, file)
    folder.mkdir(parents=True, exist_ok=True)
    for view, features in computed.items():
        tmp = folder / f"view{view}.part.npy"
        np.save(tmp, features)
        tmp.replace(folder / f"view{view}.npy")
        views[view] = torch.from_numpy(features)
    return views, trunk, time.perf_counter() - start


def prepare_inputs(dataset, split, config, file=None):
    """Inputs for the runs. Frozen backbone: features of every image (clean) and
    ``config.aug_views`` augmented views of the training-class images, cached;
    a Standardize trunk fitted on the training split. Otherwise: the images."""
    file = file or sys.stderr
    if backbones.is_frozen(config.backbone):
        train_class_rows = np.flatnonzero(dataset.is_train())
        rows_by_view = {0: np.arange(len(dataset.images))}
        rows_by_view.update({view: train_class_rows for view in range(1, config.aug_views + 1)})
        features, trunk, seconds = cached_views(dataset, rows_by_view, config, file)
        clean = features[0]
        position = np.searchsorted(train_class_rows, split.train)
        views = [clean[split.train]] + [features[v][position] for v in range(1, config.aug_views + 1)]
        standardize = backbones.Standardize(clean[split.train], trunk.tap_sizes)
        return Inputs(
            split=split,
            train_inputs=torch.stack(views),
            val_inputs=clean[split.val],
            test_inputs=clean[split.test],
            in_features=clean.shape[1],
            make_trunk=lambda: standardize,
            frozen=True,
            seconds=seconds,
        )
    images = torch.from_numpy(dataset.images)
    probe = backbones.build_trunk(config.backbone, dataset.image_size)
    return Inputs(
        split=split,
        train_inputs=images[split.train],
        val_inputs=images[split.val],
        test_inputs=images[split.test],
        in_features=probe.out_features,
        make_trunk=lambda: backbones.build_trunk(config.backbone, dataset.image_size),
        frozen=False,
        trunk_lr_multiplier=(
            config.trunk_lr_multiplier
            if "efficientnet" in config.backbone
            else config.scratch_trunk_lr_multiplier
        ),
        train_collate=collate_train_images,
        eval_collate=collate_eval_images,
    )
