"""The potential-field losses inside PML's own trainer and tester, unchanged,
with the paper's optimisers: Adam, proxies at 100x the network's learning rate."""

import numpy as np
import pytest
import torch
from pytorch_metric_learning import samplers, trainers
from pytorch_metric_learning.utils import common_functions as c_f

from pml_fieldlosses import losses

from .test_trainer_integration import map_at_r
from .toy_data import make_models, make_toy_datasets

NUM_CLASSES, EMBEDDING_SIZE = 16, 16
CPU = torch.device("cpu")
LR = 3e-3

LOSSES = {
    "PotentialField": lambda: losses.PotentialFieldLoss(NUM_CLASSES, EMBEDDING_SIZE),
    "ContrastivePotential": lambda: losses.ContrastivePotentialLoss(NUM_CLASSES, EMBEDDING_SIZE),
}


@pytest.mark.parametrize("loss_name", LOSSES)
def test_metric_loss_only_training_beats_untrained_model(loss_name, monkeypatch):
    monkeypatch.setattr(c_f, "NUMPY_RANDOM", np.random.RandomState(0))  # the sampler's batches
    train_set, test_set = make_toy_datasets()
    trunk, embedder = make_models(embedding_size=EMBEDDING_SIZE)
    loss_fn = LOSSES[loss_name]()
    before = map_at_r(test_set, trunk, embedder)
    optimizers = {
        "trunk_optimizer": torch.optim.Adam(trunk.parameters(), lr=LR),
        "embedder_optimizer": torch.optim.Adam(embedder.parameters(), lr=LR),
        "metric_loss_optimizer": torch.optim.Adam(loss_fn.parameters(), lr=100 * LR),
    }
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
    proxies_before = loss_fn.proxies.detach().clone()
    trainer.train(num_epochs=8)
    after = map_at_r(test_set, trunk, embedder)
    print(f"{loss_name}: MAP@R untrained {before:.3f} -> trained {after:.3f}")
    assert not torch.equal(loss_fn.proxies.detach(), proxies_before)  # the proxies were trained
    assert before < 0.35, before
    assert after > before + 0.15, (before, after)
