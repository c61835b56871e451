"""Our losses inside PML's own trainer and tester, unchanged."""

import numpy as np
import pytest
import torch
from pytorch_metric_learning import samplers, trainers
from pytorch_metric_learning.utils import common_functions as c_f

from pml_fieldlosses import losses

from .toy_data import make_models, make_tester, make_toy_datasets

NUM_CLASSES, EMBEDDING_SIZE = 16, 16
CPU = torch.device("cpu")
LR = 3e-3


def map_at_r(dataset, trunk, embedder):
    accuracies = make_tester().test({"test": dataset}, 0, trunk, embedder)
    return accuracies["test"]["mean_average_precision_at_r_level0"]


# loss, and the learning rate of its parameters as a multiple of the network's: the mean
# fields at 10x, the potential-field proxies at 100x (the PFML paper's ratio)
LOSSES = {
    "MeanFieldContrastive": (lambda: losses.MeanFieldContrastiveLoss(NUM_CLASSES, EMBEDDING_SIZE), 10),
    "ClassWiseMultiSimilarity": (
        lambda: losses.ClassWiseMultiSimilarityLoss(alpha=2.0, beta=40.0, base=0.5),
        None,
    ),
    "MeanFieldClassWiseMultiSimilarity": (
        lambda: losses.MeanFieldClassWiseMultiSimilarityLoss(
            NUM_CLASSES, EMBEDDING_SIZE, alpha=2.0, beta=40.0, base=0.5, mf_reg_weight=0.1
        ),
        10,
    ),
    "PotentialField": (lambda: losses.PotentialFieldLoss(NUM_CLASSES, EMBEDDING_SIZE), 100),
    "ContrastivePotential": (lambda: losses.ContrastivePotentialLoss(NUM_CLASSES, EMBEDDING_SIZE), 100),
}


@pytest.mark.parametrize("loss_name", LOSSES)
def test_metric_loss_only_training_beats_untrained_model(loss_name, monkeypatch):
    monkeypatch.setattr(c_f, "NUMPY_RANDOM", np.random.RandomState(0))  # the sampler's batches
    train_set, test_set = make_toy_datasets()
    trunk, embedder = make_models(embedding_size=EMBEDDING_SIZE)
    build, loss_lr_factor = LOSSES[loss_name]
    loss_fn = build()
    before = map_at_r(test_set, trunk, embedder)

    optimizers = {
        "trunk_optimizer": torch.optim.Adam(trunk.parameters(), lr=LR),
        "embedder_optimizer": torch.optim.Adam(embedder.parameters(), lr=LR),
    }
    if loss_lr_factor is not None:
        optimizers["metric_loss_optimizer"] = torch.optim.Adam(loss_fn.parameters(), lr=loss_lr_factor * LR)
    parameters_before = [p.detach().clone() for p in loss_fn.parameters()]
    labels = train_set.tensors[1]
    trainer = trainers.MetricLossOnly(
        models={"trunk": trunk, "embedder": embedder},
        optimizers=optimizers,
        batch_size=32,
        loss_funcs={"metric_loss": loss_fn},
        dataset=train_set,
        sampler=samplers.MPerClassSampler(labels, m=4, length_before_new_iter=len(labels)),
        dataloader_num_workers=0,
        data_device=CPU,
    )
    trainer.train(num_epochs=8)
    after = map_at_r(test_set, trunk, embedder)
    print(f"{loss_name}: MAP@R untrained {before:.3f} -> trained {after:.3f}")
    for p, p_before in zip(loss_fn.parameters(), parameters_before):
        assert not torch.equal(p.detach(), p_before)  # trained through metric_loss_optimizer
    assert before < 0.35, before
    assert after > before + 0.15, (before, after)
