"""RelationalEmbedder + RelationalLoss trained by PML's own trainers, testers and logging hooks."""

import logging

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners, trainers
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import logging_presets

from pml_fieldlosses.losses import MeanFieldContrastiveLoss
from pml_fieldlosses.losses.relational_loss import RelationalLoss
from pml_fieldlosses.models import RelationalEmbedder

from .toy_data import make_tester

NUM_CLASSES, INPUT_SIZE, SIGNAL_SIZE = 8, 16, 4
FEATURES, EMBEDDING_SIZE, NUM_BRANCHES = 64, 32, 4
BRANCH_SIZE = EMBEDDING_SIZE // NUM_BRANCHES
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def single_thread_quiet():
    # tiny models: one thread is ~10x faster than two on a busy 2-core machine
    threads = torch.get_num_threads()
    level = c_f.LOGGER.level
    torch.set_num_threads(1)
    c_f.LOGGER.setLevel(logging.WARNING)
    yield
    torch.set_num_threads(threads)
    c_f.LOGGER.setLevel(level)


def toy_dataset(samples_per_class, seed):
    """Class means in the first SIGNAL_SIZE inputs, unit Gaussian noise in all of them:
    a random trunk mixes in the noise, training learns to ignore it."""
    means = torch.randn(NUM_CLASSES, SIGNAL_SIZE, generator=torch.Generator().manual_seed(0)) * 1.5
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(NUM_CLASSES).repeat_interleave(samples_per_class)
    signal = means[labels] + 0.5 * torch.randn(len(labels), SIGNAL_SIZE, generator=g)
    noise = torch.randn(len(labels), INPUT_SIZE - SIGNAL_SIZE, generator=g)
    return torch.utils.data.TensorDataset(torch.cat([signal, noise], dim=1), labels)


TRAIN, VAL = toy_dataset(64, seed=1), toy_dataset(32, seed=2)


def make_models():
    torch.manual_seed(0)
    trunk = torch.nn.Sequential(torch.nn.Linear(INPUT_SIZE, FEATURES), torch.nn.ReLU())
    return {"trunk": trunk, "embedder": RelationalEmbedder(FEATURES, EMBEDDING_SIZE, NUM_BRANCHES)}


def make_optimizers(models, loss_funcs):
    optimizers = {
        f"{name}_optimizer": torch.optim.Adam(m.parameters(), lr=1e-2) for name, m in models.items()
    }
    for name, loss in loss_funcs.items():
        if list(loss.parameters()):
            optimizers[f"{name}_optimizer"] = torch.optim.Adam(loss.parameters(), lr=1e-2)
    return optimizers


def map_at_r(models):
    accuracies = make_tester().test({"val": VAL}, 1, models["trunk"], models["embedder"])
    return accuracies["val"]["mean_average_precision_at_r_level0"]


BASE_LOSSES = {
    "ProxyAnchor": (
        lambda: pml_losses.ProxyAnchorLoss(NUM_CLASSES, EMBEDDING_SIZE),
        lambda: pml_losses.ProxyAnchorLoss(NUM_CLASSES, BRANCH_SIZE),
        None,
    ),
    "MeanFieldContrastive": (
        lambda: MeanFieldContrastiveLoss(NUM_CLASSES, EMBEDDING_SIZE),
        lambda: MeanFieldContrastiveLoss(NUM_CLASSES, BRANCH_SIZE),
        None,
    ),
    "Triplet+miner": (
        lambda: pml_losses.TripletMarginLoss(margin=0.2),
        None,
        lambda: miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard"),
    ),
}


@pytest.mark.parametrize("case", BASE_LOSSES)
def test_metric_loss_only_beats_the_untrained_model(case):
    base_loss, branch_loss, miner = BASE_LOSSES[case]
    models = make_models()
    loss_funcs = {
        "metric_loss": RelationalLoss(base_loss(), branch_loss, NUM_BRANCHES, representation_weight=10)
    }
    mining_funcs = {"tuple_miner": miner()} if miner else {}
    trainer = trainers.MetricLossOnly(
        models,
        make_optimizers(models, loss_funcs),
        64,
        loss_funcs,
        TRAIN,
        mining_funcs=mining_funcs,
        dataloader_num_workers=0,
        data_device=CPU,
    )
    before = map_at_r(models)
    trainer.train(num_epochs=6)
    after = map_at_r(models)
    assert after > before + 0.15, (before, after)


def test_train_with_classifier():
    models = make_models()
    models["classifier"] = torch.nn.Linear(EMBEDDING_SIZE, NUM_CLASSES)
    classifier_before = models["classifier"].weight.detach().clone()
    loss_funcs = {
        "metric_loss": RelationalLoss(**loss_funcs_kwargs()),
        "classifier_loss": torch.nn.CrossEntropyLoss(),
    }
    trainer = trainers.TrainWithClassifier(
        models,
        make_optimizers(models, loss_funcs),
        64,
        loss_funcs,
        TRAIN,
        loss_weights={"metric_loss": 1, "classifier_loss": 0.5},
        dataloader_num_workers=0,
        data_device=CPU,
    )
    before = map_at_r(models)
    trainer.train(num_epochs=4)
    assert map_at_r(models) > before + 0.1
    assert not torch.equal(models["classifier"].weight, classifier_before)
    features, labels = VAL.tensors
    models["trunk"].eval()
    models["embedder"].eval()
    with torch.no_grad():
        logits = models["classifier"](models["embedder"](models["trunk"](features)))
    assert (logits.argmax(dim=1) == labels).float().mean() > 0.5


def test_logging_hooks_subset_miner_and_model_saving(tmp_path):
    pytest.importorskip("tensorboard")
    record_keeper, _, writer = logging_presets.get_record_keeper(tmp_path / "logs", tmp_path / "tensorboard")
    hooks = logging_presets.get_hook_container(record_keeper, log_freq=1)
    tester = make_tester(end_of_testing_hook=hooks.end_of_testing_hook)
    model_folder = tmp_path / "models"
    models = make_models()
    loss_funcs = {"metric_loss": RelationalLoss(**loss_funcs_kwargs(), collect_stats=True)}
    subset_miner = FirstSamples(48, models["embedder"])
    trainer = trainers.MetricLossOnly(
        models,
        make_optimizers(models, loss_funcs),
        64,
        loss_funcs,
        TRAIN,
        # an eval-mode, no-grad forward before every training forward
        mining_funcs={"subset_batch_miner": subset_miner},
        dataloader_num_workers=0,
        data_device=CPU,
        end_of_iteration_hook=hooks.end_of_iteration_hook,
        end_of_epoch_hook=hooks.end_of_epoch_hook(tester, {"val": VAL}, str(model_folder), test_interval=1),
    )
    trainer.train(num_epochs=2)
    writer.close()
    assert len(subset_miner.calls) == 16 and not any(subset_miner.calls)

    loss_record = record_keeper.query("SELECT * FROM metric_loss_RelationalLoss", return_dict=True)
    assert len(loss_record["representation_weight"]) == 16 and set(loss_record["representation_weight"]) == {
        1.0
    }
    branch_counts = [loss_record[f"num_samples_branch_{k}"] for k in range(NUM_BRANCHES)]
    assert all(sum(counts) == 48 for counts in zip(*branch_counts))
    assert set(hooks.get_loss_history()) >= {"metric_loss", "total_loss"}
    assert len(hooks.get_accuracy_history(tester, "val")["epoch"]) == 2

    restored = make_models()
    restored_losses = {"metric_loss": RelationalLoss(**loss_funcs_kwargs())}
    restored_trainer = trainers.MetricLossOnly(
        restored, make_optimizers(restored, restored_losses), 64, restored_losses, TRAIN, data_device=CPU
    )
    assert hooks.load_latest_saved_models(restored_trainer, str(model_folder), CPU) == 3
    features = VAL.tensors[0][:10]
    for name in ["trunk", "embedder"]:
        models[name].eval()
        restored[name].eval()
    torch.testing.assert_close(
        restored["embedder"](restored["trunk"](features)), models["embedder"](models["trunk"](features))
    )
    torch.testing.assert_close(
        restored_losses["metric_loss"].base_loss.proxies, loss_funcs["metric_loss"].base_loss.proxies
    )


class FirstSamples(torch.nn.Module):
    """A subset-batch miner (PML calls it in eval mode under no_grad) keeping the first samples;
    records whether the embedder was in training mode or grad was enabled."""

    def __init__(self, num_samples, embedder):
        super().__init__()
        self.num_samples = num_samples
        self.calls = []
        self.watched = [embedder]  # a list: not a submodule

    def forward(self, embeddings, labels):
        self.calls.append(self.watched[0].training or torch.is_grad_enabled())
        return torch.arange(self.num_samples)


def loss_funcs_kwargs():
    return dict(
        base_loss=pml_losses.ProxyAnchorLoss(NUM_CLASSES, EMBEDDING_SIZE),
        branch_losses=lambda: pml_losses.ProxyAnchorLoss(NUM_CLASSES, BRANCH_SIZE),
        num_branches=NUM_BRANCHES,
    )
