"""state_dict round trips, and an interrupted PML run resumed from PML's own checkpoints."""

import io

import pytest
import torch
from pytorch_metric_learning import trainers
from pytorch_metric_learning.utils import logging_presets

from pml_fieldlosses import losses

from .toy_data import make_models, make_tester, make_toy_datasets

C, D = 16, 16
PARAMETRIC_LOSSES = {
    "MeanFieldContrastive": lambda: losses.MeanFieldContrastiveLoss(C, D, mf_reg_weight=0.1),
    "MeanFieldClassWiseMultiSimilarity": lambda: losses.MeanFieldClassWiseMultiSimilarityLoss(
        C, D, alpha=2.0, beta=40.0, base=0.5
    ),
    "PotentialField": lambda: losses.PotentialFieldLoss(C, D, delta=0.5, alpha=2.0),
    "ContrastivePotential": lambda: losses.ContrastivePotentialLoss(C, D, delta=0.5),
}


@pytest.mark.parametrize("name", PARAMETRIC_LOSSES)
def test_state_dict_round_trip_is_exact(name):
    torch.manual_seed(0)
    saved = PARAMETRIC_LOSSES[name]()
    buffer = io.BytesIO()
    torch.save(saved.state_dict(), buffer)
    buffer.seek(0)
    torch.manual_seed(1)
    loaded = PARAMETRIC_LOSSES[name]()
    assert not all(torch.equal(a, b) for a, b in zip(saved.parameters(), loaded.parameters()))
    loaded.load_state_dict(torch.load(buffer, weights_only=True))
    x, y = torch.randn(10, D), torch.randint(0, C, (10,))
    for a, b in zip(saved.parameters(), loaded.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(saved(x, y), loaded(x, y))


def seed_epoch(epoch):
    """Makes the batches of an epoch depend only on its number. (The sampler is
    torch's RandomSampler: PML's MPerClassSampler keeps its shuffled label order
    from epoch to epoch, a state PML's checkpoints do not hold.)"""
    torch.manual_seed(epoch)


def train(loss_name, folder, num_epochs, resume=False):
    train_set, test_set = make_toy_datasets(num_classes=C)
    trunk, embedder = make_models(embedding_size=D, seed=1 if resume else 0)
    loss_func = PARAMETRIC_LOSSES[loss_name]()
    optimizers = {
        "trunk_optimizer": torch.optim.Adam(trunk.parameters(), lr=3e-3),
        "embedder_optimizer": torch.optim.Adam(embedder.parameters(), lr=3e-3),
        "metric_loss_optimizer": torch.optim.Adam(loss_func.parameters(), lr=3e-2),
    }
    record_keeper, _, writer = logging_presets.get_record_keeper(
        str(folder / "logs"), str(folder / "tensorboard")
    )
    hooks = logging_presets.get_hook_container(record_keeper)
    tester = make_tester(end_of_testing_hook=hooks.end_of_testing_hook)
    save_and_test = hooks.end_of_epoch_hook(tester, {"val": test_set}, str(folder / "models"))

    def end_of_epoch(trainer):
        keep_going = save_and_test(trainer)
        seed_epoch(trainer.epoch + 1)
        return keep_going

    trainer = trainers.MetricLossOnly(
        models={"trunk": trunk, "embedder": embedder},
        optimizers=optimizers,
        batch_size=32,
        loss_funcs={"metric_loss": loss_func},
        dataset=train_set,
        sampler=torch.utils.data.RandomSampler(train_set),
        dataloader_num_workers=0,
        data_device=torch.device("cpu"),
        end_of_iteration_hook=hooks.end_of_iteration_hook,
        end_of_epoch_hook=end_of_epoch,
    )
    start_epoch = hooks.load_latest_saved_models(trainer, str(folder / "models"), torch.device("cpu"))
    seed_epoch(start_epoch)
    trainer.train(start_epoch, num_epochs)
    writer.close()
    return trunk, embedder, loss_func, start_epoch


@pytest.mark.parametrize("loss_name", PARAMETRIC_LOSSES)
def test_interrupted_training_resumes_bit_identically(loss_name, tmp_path):
    straight = train(loss_name, tmp_path / "straight", num_epochs=4)
    train(loss_name, tmp_path / "interrupted", num_epochs=2)
    resumed = train(loss_name, tmp_path / "interrupted", num_epochs=4, resume=True)
    assert straight[3] == 1 and resumed[3] == 3
    for a, b in zip(straight[:3], resumed[:3]):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            assert torch.equal(p, q), name
