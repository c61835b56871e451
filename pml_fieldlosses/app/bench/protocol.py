"""The benchmark's settings, class splits and label noise."""

import dataclasses
import hashlib
import json
import multiprocessing
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from .. import backbones
from ..catalog import default_losses, hyperparameters
from ..datasets import DATASETS
from ..errors import UsageError
from .result import canonical_name

# bump when a change of the code changes the results of the same settings
PROTOCOL_VERSION = 2


@dataclass
class BenchConfig:
    """Everything that defines a benchmark run. Fields marked ``protocol`` change
    the results and so the output folder; the others only choose what to run
    or where."""

    losses: tuple = field(default_factory=default_losses)
    seeds: int = 3
    data: str = "emoji"  # a built-in data set (datasets.DATASETS) or a folder with one sub-folder per class
    backbone: str = "efficientnet-lite0"
    image_size: int = 64
    embedding_size: int = 128
    epochs: int = 60  # maximum; early stopping on validation MAP@R may end a run sooner
    patience: int = 10  # stop when the best validation epoch is more than this many epochs old
    label_noise: float = 0.0
    batch_size: int = 128
    m_per_class: int = 4
    lr: float = 1e-2  # AdamW for the embedder (kaiming-normal fan_out init, see catalog.linear_embedder)
    weight_decay: float = 1e-4
    loss_lr_multiplier: float = 1.0  # lr of learnable loss parameters (proxies, W, mean fields): 1e-2
    lr_decay_epochs: int = 10  # StepLR: every optimiser's lr is multiplied by lr_decay every this many epochs
    lr_decay: float = 0.5
    grad_clip: float = 10.0  # max gradient norm, per optimiser's parameter group; 0 disables
    val_fraction: float = 0.2  # share of the training classes held out for model selection
    aug_views: int = 4  # augmented views per training image (frozen backbone: cached features)
    device: str = "cpu"
    workers: int = 0  # runs side by side; 0: one per CPU core (1 on a GPU)
    ray_address: Optional[str] = None  # run on Ray: "local" (a new local instance), "auto" or HOST:PORT
    out: str = "bench_out"
    cache: Optional[str] = None
    quick: bool = False

    # fields that do not change any single (loss, seed) result
    NOT_PROTOCOL = ("losses", "seeds", "device", "workers", "ray_address", "out", "cache", "quick")

    def __post_init__(self):
        self.losses = tuple(self.losses)
        if self.seeds < 1:
            raise UsageError(f"--seeds must be >= 1, got {self.seeds}")
        if self.epochs < 1:
            raise UsageError(f"--epochs must be >= 1, got {self.epochs}")
        if self.embedding_size < 2:
            raise UsageError(f"--embedding-size must be >= 2, got {self.embedding_size}")
        if self.image_size < 16:
            raise UsageError(f"--image-size must be >= 16, got {self.image_size}")
        if not 0 <= self.label_noise < 1:
            raise UsageError(f"--label-noise must be in [0, 1), got {self.label_noise}")
        if not 0 < self.val_fraction < 1:
            raise UsageError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.lr_decay_epochs < 1 or not 0 < self.lr_decay <= 1:
            raise UsageError("lr_decay_epochs must be >= 1 and lr_decay in (0, 1]")
        if self.grad_clip < 0:
            raise UsageError(f"grad_clip must be >= 0 (0: no clipping), got {self.grad_clip}")
        if self.batch_size % self.m_per_class:
            raise UsageError("batch_size must be a multiple of m_per_class")
        backbones.get_backbone(self.backbone)
        # an unknown name fails now, not after the data is built; two spellings of one
        # setting (PFML[delta=.5], PFML[delta=0.5]) are one loss, trained in one folder
        canonical = [canonical_name(name) for name in self.losses]
        twice = sorted({name for name, c in zip(self.losses, canonical) if canonical.count(c) > 1})
        if twice:
            raise UsageError(
                f"--losses names {', '.join(twice)} more than once (one setting, however written); "
                "give each loss once"
            )

    def protocol(self, selected=True):
        """The settings that define the results; with the losses' selected
        hyperparameters unless ``selected`` is False (the selection's own runs
        name their values)."""
        settings = {k: v for k, v in dataclasses.asdict(self).items() if k not in self.NOT_PROTOCOL}
        backbone = backbones.get_backbone(self.backbone)
        settings["trunk_lr_multiplier"] = backbone.trunk_lr_multiplier
        settings.update(backbone.protocol())
        if selected:
            settings["hyperparameters"] = hyperparameters()
        return {**settings, "protocol_version": PROTOCOL_VERSION}

    def protocol_hash(self, selected=True):
        text = json.dumps(self.protocol(selected), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    def folder_name(self, selection=False):
        """The results folder; ``selection``: the hyperparameter selection's."""
        noise = f"-noise{self.label_noise:g}" if self.label_noise else ""
        kind = "-selection" if selection else ""
        name = f"{self._data_name()}-{self.backbone}-{self.image_size}px{noise}{kind}"
        return f"{name}-{self.protocol_hash(selected=not selection)}"

    def _data_name(self):
        if self.data in DATASETS:
            return self.data
        return "folder-" + "".join(
            c if c.isalnum() else "_" for c in str(self.data).rstrip("/").split("/")[-1]
        )


def number_of_workers(config, jobs):
    """Processes to run ``jobs`` side by side: ``config.workers``, or one per
    CPU core (1 on a GPU, or where processes cannot be forked)."""
    if config.workers:
        workers = config.workers
    elif torch.device(config.device).type != "cpu":
        workers = 1
    else:
        workers = os.cpu_count() or 1
    if "fork" not in multiprocessing.get_all_start_methods():
        workers = 1
    return max(1, min(workers, jobs))


def quick_config(**overrides):
    """``--quick``: the same protocol at a smaller budget (fewer epochs, seeds and
    augmented views); explicit options still win."""
    settings = dict(seeds=2, epochs=12, patience=4, lr_decay_epochs=4, aug_views=1, quick=True)
    settings.update(overrides)
    return BenchConfig(**settings)


@dataclass
class Split:
    """Indices into the ImageSet for each split, and the labels the runs use.
    Training labels are 0..num_train_classes-1 (proxy losses need that)."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    train_labels: np.ndarray
    val_labels: np.ndarray
    test_labels: np.ndarray
    num_train_classes: int


def make_split(dataset, val_fraction):
    """The training classes of ``dataset`` give round(val_fraction * their
    number) classes (at least 2, spread evenly over the training classes) to
    the validation split; the test classes are untouched."""
    num_train = dataset.num_train_classes
    num_val = max(2, int(round(val_fraction * num_train)))
    if num_train - num_val < 2:
        raise ValueError(
            f"{num_train} training classes are too few to hold out {num_val} for validation: "
            "the benchmark needs at least 8 classes in all"
        )
    val_classes = ((np.arange(num_val) + 0.5) * num_train / num_val).astype(np.int64)
    is_val_class = np.zeros(dataset.num_classes, dtype=bool)
    is_val_class[val_classes] = True
    labels = dataset.labels
    is_train_class = labels < num_train
    train = np.flatnonzero(is_train_class & ~is_val_class[labels])
    val = np.flatnonzero(is_train_class & is_val_class[labels])
    test = np.flatnonzero(~is_train_class)
    _, train_labels = np.unique(labels[train], return_inverse=True)
    return Split(
        train=train,
        val=val,
        test=test,
        train_labels=train_labels.astype(np.int64),
        val_labels=labels[val],
        test_labels=labels[test],
        num_train_classes=int(train_labels.max()) + 1,
    )


def training_labels(split, label_noise, seed):
    """The labels a run trains with: the split's training labels, with exactly
    round(label_noise * N) of them changed (seeded by the run's seed).
    Validation and test labels are never touched. Returns (labels, changed)."""
    if not label_noise:
        return split.train_labels, np.array([], dtype=np.int64)
    return corrupt_labels(split.train_labels, label_noise, split.num_train_classes, seed)


def corrupt_labels(labels, fraction, num_classes, seed):
    """Change exactly round(fraction * N) of ``labels`` (chosen without
    replacement) to a different class drawn uniformly from the other
    num_classes - 1. Returns (new labels, indices changed)."""
    if not 0 <= fraction < 1:
        raise ValueError(f"label noise fraction must be in [0, 1), got {fraction}")
    if num_classes < 2 and fraction > 0:
        raise ValueError("label noise needs at least 2 classes")
    labels = np.asarray(labels, dtype=np.int64)
    rng = np.random.default_rng(seed)
    changed = np.sort(rng.choice(len(labels), size=int(round(fraction * len(labels))), replace=False))
    offset = rng.integers(1, num_classes, size=len(changed))  # never 0: always a different class
    noisy = labels.copy()
    noisy[changed] = (labels[changed] + offset) % num_classes
    return noisy, changed
