"""Benchmark your own loss with pml-fieldlosses-pb (powerful-benchmarker, MLRC protocol).

Three steps: define the loss (here: a proxy loss written for this example), make pb find
it (``--register loss=<module>``), and give it a config file in a copy of our config root.
Then run pb as usual. To keep this to about a minute on a CPU it runs on the generated
images with a tiny convnet and a short schedule; for the real protocol drop the
``--config_dataset/--config_models/--config_transforms/--config_general/--config_eval``
and ``--sampler`` options and add ``--bayes_opt_iters 50`` with a ``~BAYESIAN~`` config.

    python examples/pb_custom_loss.py [experiments folder]
"""

import shutil
import sys
import tempfile
from pathlib import Path

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction, WeightRegularizerMixin
from pytorch_metric_learning.utils import common_functions as c_f

from pml_fieldlosses.app.benchmarker import main
from pml_fieldlosses.app.benchmarker.launcher import default_config_root


class NearestProxyHingeLoss(WeightRegularizerMixin, BaseMetricLossFunction):
    """One learnable proxy per class; each embedding's cosine similarity to its own proxy
    should exceed that to every other proxy by ``margin`` (hinge, averaged)."""

    def __init__(self, num_classes, embedding_size, margin=0.2, **kwargs):
        super().__init__(**kwargs)
        self.margin = margin
        self.proxies = torch.nn.Parameter(torch.Tensor(num_classes, embedding_size))
        self.weight_init_func(self.proxies)
        self.add_to_recordable_attributes(list_of_names=["margin"], is_stat=False)

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        c_f.ref_not_supported(embeddings, labels, ref_emb, ref_labels)
        self.proxies.data = c_f.to_device(self.proxies.data, embeddings)
        similarities = self.distance(embeddings, self.proxies)
        own = similarities.gather(1, labels.unsqueeze(1))
        hinge = torch.relu(self.margin + similarities - own).scatter(1, labels.unsqueeze(1), 0.0)
        losses = hinge.mean(dim=1)
        return {
            "loss": {
                "losses": losses,
                "indices": c_f.torch_arange_from_size(embeddings),
                "reduction_type": "element",
            }
        }

    def get_default_distance(self):
        return CosineSimilarity()


LOSS_CONFIG = """\
loss_funcs~OVERRIDE~:
  metric_loss:
    NearestProxyHingeLoss:
      embedding_size: 128
      margin: 0.2
sampler~OVERRIDE~:
  MPerClassSampler:
    m: 1
mining_funcs~OVERRIDE~: {}
"""
OPTIMIZER_CONFIG = """\
optimizers:
  metric_loss_optimizer:
    RMSprop:
      lr: 0.001
      weight_decay: 0.0001
      momentum: 0.9
"""


def run(experiments):
    configs = Path(tempfile.mkdtemp()) / "configs"
    shutil.copytree(default_config_root(), configs)
    (configs / "config_loss_and_miners" / "nearest_proxy_hinge.yaml").write_text(LOSS_CONFIG)
    (configs / "config_optimizers" / "nearest_proxy_hinge.yaml").write_text(OPTIMIZER_CONFIG)
    # this script is the module that holds the loss; pb's options as the shell would split them
    quick = ["--config_dataset", "[default,", "synthetic]", "--config_models", "[default,", "tiny]"]
    quick += ["--config_transforms", "[default,", "small]"]
    quick += ["--config_general", "[default,", "quick]", "--config_eval", "[default,", "quick]"]
    quick += ["--sampler~APPLY~2", "{length_before_new_iter:", "256}"]
    common = ["--register", f"loss={__name__}", "--root_config_folder", str(configs)]
    common += ["--root_experiment_folder", experiments, "--experiment_name", "nearest_proxy_hinge"]
    main([*common, *quick, "--config_loss_and_miners", "[nearest_proxy_hinge]",
          "--config_optimizers", "[default,", "nearest_proxy_hinge]"])  # fmt: skip
    main([*common, "--evaluate", "--splits_to_eval", "[test]"])
    main([*common, "--evaluate_ensemble", "--splits_to_eval", "[test]"])
    print(f"results: {experiments}/nearest_proxy_hinge/meta_logs/saved_csvs/")


if __name__ == "__main__":
    run(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
