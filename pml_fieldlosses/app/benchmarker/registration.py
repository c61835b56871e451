"""Makes a pb runner find our losses, models, datasets and trunks by name."""

import torch
from powerful_benchmarker import factories as pb_factories
from powerful_benchmarker.utils import common_functions as pb_c_f

from ... import losses
from ..errors import UsageError
from . import compat, synthetic


class ModelFactory(pb_factories.ModelFactory):
    """pb's ModelFactory, also for trunks without a last linear layer and for embedders
    that take the trunk's output size as ``in_features``.

    A trunk with ``fc`` or ``last_linear`` is handled as in pb (that layer's input size is
    the trunk's output size, the layer becomes Identity). Otherwise the trunk's int
    ``out_features`` attribute (as pml_fieldlosses.app.backbones' trunks have), or the
    factory's ``base_model_output_size``, gives it.
    """

    def create_trunk(self, model_type):
        trunk = self.getter.get("model", yaml_dict=model_type)
        last_linear = pb_c_f.get_last_linear(trunk)
        if last_linear is not None:
            self.base_model_output_size = last_linear.in_features
            pb_c_f.set_last_linear(trunk, torch.nn.Identity())
        elif isinstance(getattr(trunk, "out_features", None), int):
            self.base_model_output_size = trunk.out_features
        elif self.base_model_output_size is None:
            raise UsageError(
                f"the output size of trunk {type(trunk).__name__} is unknown: it has no fc/last_linear "
                "layer and no int out_features attribute; set base_model_output_size in "
                "factories: model: ModelFactory"
            )
        return trunk

    def create_embedder(self, model_type, input_size=None, output_size=None):
        ((name, params),) = model_type.items()
        params = dict(params or {})
        model_class, _ = self.getter.get("model", class_name=name, return_uninitialized=True)
        takes_in_features = pb_c_f.check_init_arguments(model_class, "in_features")
        if input_size is not None and "in_features" not in params and takes_in_features:
            params["in_features"] = input_size
        return super().create_embedder({name: params}, input_size, output_size)


def field_classes():
    """kind -> our classes that pb should find by name (our losses module: only our losses,
    RelationalLoss included; pb finds PML's own losses in PML)."""
    from ...models import RelationalEmbedder
    from . import datasets, trunks

    return {
        "loss": [losses],
        "model": [
            synthetic.TinyConvNet,
            trunks.SmallConvNet,
            trunks.EfficientNetLite0,
            trunks.FeatureInput,
            RelationalEmbedder,
        ],
        "dataset": [synthetic.SyntheticImages, datasets.Emoji, datasets.EmojiFeatures, datasets.ClassFolders],
        "factory": [ModelFactory],
    }


def register(runner):
    """Register the compatibility classes and our losses, models and datasets with a pb
    runner (``runner.register(kind, class_or_module)``, which puts them first in pb's
    lookup by name). Call ``compat.restore_identity_in_pml()`` before creating the runner."""
    for mapping in (compat.REGISTRATIONS, field_classes()):
        for kind, classes in mapping.items():
            for cls in classes:
                runner.register(kind, cls)
    return runner
