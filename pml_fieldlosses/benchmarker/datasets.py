"""pml_fieldlosses' image sets (pml_fieldlosses.datasets) as pb datasets.

pb builds a dataset as ``Dataset(root=<--dataset_root>, transform=..., download=...)``,
six times per run (train/eval transforms x train/val/test), reads its ``labels`` and
takes items ``{"data": image, "label": label}``. Labels are class indices in the image
set's order, whose first half are its training classes: the MLRC split
(config_dataset/emoji) uses the same first half for its 4 folds and tests on the rest.
"""

import functools

import torch
from PIL import Image

from .. import datasets as field_datasets


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


class Emoji(ImageSetDataset):
    """Multi-vendor emoji (pml_fieldlosses.datasets.load_emoji), built with npm on first
    use under ``<root>/emoji`` (pb's --dataset_root) and read from there afterwards;
    ``download`` is accepted for pb and not needed."""

    def __init__(self, root, transform=None, download=False, image_size=64, vendors=None):
        vendors = tuple(vendors) if vendors is not None else tuple(field_datasets.DEFAULT_VENDORS)
        super().__init__(cached_emoji(image_size, vendors, str(root)), transform)


class ClassFolders(ImageSetDataset):
    """Your images, one sub-folder per class under ``root``
    (pml_fieldlosses.datasets.load_image_folder; classes sorted by folder name)."""

    def __init__(self, root, transform=None, download=False, image_size=64):
        super().__init__(cached_image_folder(str(root), image_size), transform)
