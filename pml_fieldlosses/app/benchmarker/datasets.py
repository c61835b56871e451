"""pml_fieldlosses' image sets (pml_fieldlosses.app.datasets) as pb datasets.

pb builds a dataset as ``Dataset(root=<--dataset_root>, transform=..., download=...)``,
six times per run (train/eval transforms x train/val/test), reads its ``labels`` and
takes items ``{"data": image, "label": label}``. Labels are class indices in the image
set's order, whose first half are its training classes: the MLRC split
(config_dataset/emoji) uses the same first half for its 4 folds and tests on the rest.
"""

import functools
import types

import numpy as np
import torch
from PIL import Image

from .. import datasets as field_datasets
from ..errors import UsageError


class ImageSetDataset(torch.utils.data.Dataset):
    """A pml_fieldlosses ImageSet with pb's dataset interface (PIL RGB images)."""

    def __init__(self, image_set, transform=None):
        self.image_set = image_set
        self.labels = image_set.labels
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        image = Image.fromarray(self.image_set.images[idx])
        if self.transform is not None:
            image = self.transform(image)
        return {"data": image, "label": self.labels[idx]}


@functools.lru_cache(maxsize=4)
def cached_emoji(image_size, vendors, cache):
    return field_datasets.load_emoji(image_size=image_size, vendors=vendors, cache=cache)


@functools.lru_cache(maxsize=4)
def cached_image_folder(root, image_size):
    return field_datasets.load_image_folder(root, image_size=image_size)


class ClassFolders(ImageSetDataset):
    """Your images, one sub-folder per class under ``root``
    (pml_fieldlosses.app.datasets.load_image_folder; classes sorted by folder name)."""

    def __init__(self, root, transform=None, download=False, image_size=64):
        super().__init__(cached_image_folder(str(root), image_size), transform)


def emoji_subset(image_set, num_classes):
    """The first ``num_classes`` classes of an ImageSet (its first half for training)."""
    if num_classes is None:
        return image_set
    if not 4 <= num_classes <= image_set.num_classes:
        raise UsageError(f"num_classes must be in [4, {image_set.num_classes}], got {num_classes}")
    keep = image_set.labels < num_classes
    return field_datasets.ImageSet(
        image_set.images[keep], image_set.labels[keep], image_set.class_names[:num_classes],
        image_set.sources[keep], num_classes // 2, f"{image_set.name}{num_classes}",
    )  # fmt: skip


def load_emoji(image_size, vendors, cache, num_classes):
    vendors = tuple(vendors) if vendors is not None else tuple(field_datasets.DEFAULT_VENDORS)
    return emoji_subset(cached_emoji(image_size, vendors, cache), num_classes)


class Emoji(ImageSetDataset):
    """Multi-vendor emoji (pml_fieldlosses.app.datasets.load_emoji) from the bench's cache
    (``cache``, else $PML_FIELDLOSSES_CACHE, else the user cache directory), built with
    npm on first use; pb's ``root`` (--dataset_root) and ``download`` are not used.
    ``num_classes``: only the first classes (Unicode order), e.g. for quick checks."""

    def __init__(self, root=None, transform=None, download=False, image_size=64, vendors=None, cache=None,
                 num_classes=None):  # fmt: skip
        super().__init__(load_emoji(image_size, vendors, cache, num_classes), transform)


class EmojiFeatures(torch.utils.data.Dataset):
    """The emoji as frozen EfficientNet-Lite0 multi-level features (the bench's
    ``efficientnet-lite0`` backbone: computed once, cached with the bench's features),
    standardised with the statistics of the training classes (the first half; test
    classes are never looked at). Items are feature vectors: pb's image ``transform``
    is kept (pb checks it is there) but not applied. Use with the ``FeatureInput`` trunk
    (config_models/emoji_features)."""

    def __init__(self, root=None, transform=None, download=False, image_size=64, vendors=None, cache=None,
                 num_classes=None):  # fmt: skip
        self.transform = transform
        self.features, self.labels = cached_features(image_size, tuple(vendors or ()), cache, num_classes)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        return {"data": self.features[idx], "label": self.labels[idx]}


@functools.lru_cache(maxsize=4)
def cached_features(image_size, vendors, cache, num_classes):
    from ..backbones import Standardize
    from ..bench.features import cached_views

    image_set = load_emoji(image_size, vendors or None, cache, num_classes)
    config = types.SimpleNamespace(cache=cache, backbone="efficientnet-lite0", device="cpu", workers=0)
    views, trunk, _ = cached_views(image_set, {0: np.arange(len(image_set.labels))}, config)
    features = torch.as_tensor(np.asarray(views[0]), dtype=torch.float32)
    standardize = Standardize(features[np.flatnonzero(image_set.is_train())], trunk.tap_sizes)
    with torch.no_grad():
        return standardize(features).contiguous(), image_set.labels
