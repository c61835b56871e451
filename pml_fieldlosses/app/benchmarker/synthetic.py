"""A generated image dataset and a small trunk, to check a pb install in a minute on a CPU.

Registered by the launcher as the pb dataset ``SyntheticImages`` and the pb model
``TinyConvNet`` (configs: ``config_dataset/synthetic.yaml``, ``config_models/tiny.yaml``).
"""

import numpy as np
import torch
from PIL import Image

from ..errors import UsageError


class SyntheticImages(torch.utils.data.Dataset):
    """Class-structured RGB images made from a seed, no files and no download.

    Class c has a prototype: a random ``grid`` x ``grid`` colour pattern upscaled to
    ``image_size``. Its images are the prototype shifted by up to ``image_size // 8``
    pixels (circularly) plus Gaussian noise of standard deviation ``noise`` (0-255
    scale). pb's dataset interface: ``SyntheticImages(root, transform, download)`` (root
    and download are accepted and unused), ``labels`` (N,) int64 with classes in
    order, items ``{"data": image, "label": label}``.
    """

    def __init__(
        self,
        root=None,
        transform=None,
        download=False,
        num_classes=24,
        images_per_class=8,
        image_size=32,
        grid=4,
        noise=24.0,
        seed=0,
    ):
        for name, value in (("num_classes", num_classes), ("images_per_class", images_per_class)):
            if not (isinstance(value, int) and value > 0):
                raise UsageError(f"{name} must be a positive int, got {value!r}")
        if not (isinstance(image_size, int) and isinstance(grid, int) and 0 < grid <= image_size):
            raise UsageError(
                f"need ints 0 < grid <= image_size, got grid={grid!r}, image_size={image_size!r}"
            )
        self.transform = transform
        rng = np.random.default_rng(seed)
        cell = -(-image_size // grid)
        prototypes = rng.uniform(0, 255, size=(num_classes, grid, grid, 3))
        prototypes = prototypes.repeat(cell, axis=1).repeat(cell, axis=2)[:, :image_size, :image_size]
        self.labels = np.repeat(np.arange(num_classes, dtype=np.int64), images_per_class)
        max_shift = image_size // 8
        shifts = rng.integers(-max_shift, max_shift + 1, size=(len(self.labels), 2))
        images = np.stack(
            [np.roll(prototypes[c], tuple(s), axis=(0, 1)) for c, s in zip(self.labels, shifts)]
        )
        images = images + rng.normal(0, noise, size=images.shape)
        self.images = np.clip(images, 0, 255).astype(np.uint8)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        image = Image.fromarray(self.images[idx])
        if self.transform is not None:
            image = self.transform(image)
        return {"data": image, "label": self.labels[idx]}


class TinyConvNet(torch.nn.Module):
    """Three stride-2 conv-BN-ReLU blocks and global average pooling: (N, 3, H, W) ->
    (N, out_features), for normalised images (pb's default transform)."""

    def __init__(self, out_features=64, width=16):
        super().__init__()
        layers, channels = [], 3
        for out in (width, 2 * width, out_features):
            layers += [
                torch.nn.Conv2d(channels, out, 3, stride=2, padding=1, bias=False),
                torch.nn.BatchNorm2d(out),
                torch.nn.ReLU(inplace=True),
            ]
            channels = out
        self.features = torch.nn.Sequential(*layers)
        self.out_features = out_features

    def forward(self, x):
        return self.features(x).mean(dim=(2, 3))
