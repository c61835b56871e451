"""Our losses inside PML's own trainer and tester, unchanged."""

import pytest
import torch
from pytorch_metric_learning import samplers, testers, trainers
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from pml_fieldlosses import losses

from .toy_data import make_models, make_toy_datasets

NUM_CLASSES, EMBEDDING_SIZE = 16, 16
CPU = torch.device("cpu")


def map_at_r(dataset, trunk, embedder):
    tester = testers.GlobalEmbeddingSpaceTester(
        accuracy_calculator=AccuracyCalculator(include=("mean_average_precision_at_r",), k="max_bin_count"),
        dataloader_num_workers=0,
        data_device=CPU,
    )
    accuracies = tester.test({"test": dataset}, 0, trunk, embedder)
    return accuracies["test"]["mean_average_precision_at_r_level0"]


LOSSES = {
    "MeanFieldContrastive": lambda: losses.MeanFieldContrastiveLoss(NUM_CLASSES, EMBEDDING_SIZE),
    "ClassWiseMultiSimilarity": lambda: losses.ClassWiseMultiSimilarityLoss(alpha=2.0, beta=40.0, base=0.5),
    "MeanFieldClassWiseMultiSimilarity": lambda: losses.MeanFieldClassWiseMultiSimilarityLoss(
        NUM_CLASSES, EMBEDDING_SIZE, alpha=2.0, beta=40.0, base=0.5, mf_reg_weight=0.1
    ),
}


@pytest.mark.parametrize("loss_name", LOSSES)
def test_metric_loss_only_training_beats_untrained_model(loss_name):
    train_set, test_set = make_toy_datasets()
    trunk, embedder = make_models(embedding_size=EMBEDDING_SIZE)
    loss_fn = LOSSES[loss_name]()
    before = map_at_r(test_set, trunk, embedder)

    optimizers = {
        "trunk_optimizer": torch.optim.Adam(trunk.parameters(), lr=3e-3),
        "embedder_optimizer": torch.optim.Adam(embedder.parameters(), lr=3e-3),
    }
    if list(loss_fn.parameters()):
        optimizers["metric_loss_optimizer"] = torch.optim.Adam(loss_fn.parameters(), lr=3e-2)
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
    assert before < 0.35, before
    assert after > before + 0.15, (before, after)
