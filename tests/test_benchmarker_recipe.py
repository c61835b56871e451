"""The CPU recipe of docs/benchmarker.md ("A run that trains on a CPU") trains a potential-field
loss: on a small real subset (the first 96 emoji classes, google and twitter images, built from
npm into the bench's cache on first use, as frozen EfficientNet-Lite0 features), with the
recipe's model, training, evaluation and the loss's recipe files, shortened to 3 epochs of 10
iterations, every one of the 4 folds selects a trained epoch (best validation epoch > 0), and
``--evaluate`` on the test split succeeds with a "trained" row. With the MLRC proxy optimiser
(``config_optimizers/proxies``, set for a network lr of 1e-6) and the paper's delta, 2 of the 4
folds of the first 400 classes selected the untrained embedder and ``--evaluate`` refused to
report (the measurements: docs/benchmarker.md)."""

import pytest

from .pb_support import npm_skip, pb_skip
from .test_benchmarker_run import ACCURACIES, FOLDS, MAP_R, fold_rows, rows, run_launcher

MISSING, pb_mark = pb_skip("powerful_benchmarker", "torchvision")
pytestmark = [pb_mark, npm_skip()]
if not MISSING:
    import torch

# the recipe as docs/benchmarker.md writes it, for a potential-field loss (pb reads the
# command line as a shell splits it)
RECIPE = [
    "--config_dataset", "[default,", "emoji_features]",
    "--config_models", "[default,", "emoji_features]",
    "--config_general", "[default,", "emoji_features]",
    "--config_eval", "[default,", "quick]",
    "--config_loss_and_miners", "[emoji_features_potential_field]",
    "--config_optimizers", "[default,", "emoji_features,", "emoji_features_proxies]",
]  # fmt: skip
# the subset: 96 classes (4 folds of 12 validation classes, 24 images: on 48 classes a fold's 12
# validation images made MAP@R move in steps of 1/12), 3 epochs of 10 iterations
SUBSET = [
    "--dataset~APPLY~2", "{vendors:", "[google,", "twitter],", "num_classes:", "96}",
    "--sampler~APPLY~2", "{length_before_new_iter:", "320}",
    "--trainer~APPLY~2", "{iterations_per_epoch:", "10}",
    "--num_epochs_train", "3",
]  # fmt: skip


def selected_epoch(table):
    """pb's selection: the best validation MAP@R over epochs >= 0, the earliest of equals."""
    return max((r for r in table if r["epoch"] >= 0), key=lambda r: (r[MAP_R], -r["epoch"]))["epoch"]


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pb_recipe")
    run_launcher(folder, "--experiment_name", "pf", *RECIPE, *SUBSET, log_name="train.log")
    evaluate = run_launcher(
        folder, "--experiment_name", "pf", "--evaluate", "--splits_to_eval", "[test]", log_name="evaluate.log"
    )
    return folder / "pf", evaluate


def test_every_fold_selects_a_trained_epoch(recipe_run):
    experiment, _ = recipe_run
    for fold in FOLDS:
        table = fold_rows(experiment, fold)
        assert [r["epoch"] for r in table][:3] == [-1, 0, 1], fold
        assert selected_epoch(table) > 0, (fold, [(r["epoch"], r[MAP_R]) for r in table])
        # the recipe's optimisers trained the embedder and the proxies: Adam at the documented
        # rates, one step per iteration (3 epochs of 10)
        for name, lr in (("embedder_optimizer", 1e-4), ("metric_loss_optimizer", 1e-2)):
            state = torch.load(experiment / fold / "saved_models" / f"{name}_3.pth", weights_only=False)
            assert [g["lr"] for g in state["param_groups"]] == [lr], (fold, name)
            assert {int(s["step"]) for s in state["state"].values()} == {30}, (fold, name)


def test_evaluate_reports_the_trained_models(recipe_run):
    experiment, _ = recipe_run
    table = rows(
        experiment / "meta_logs" / "saved_csvs" / "logs.db", f"MeanAggregator_{ACCURACIES.format('TEST')}"
    )
    assert [r["trained_status"] for r in table] == [
        "untrained_trunk",
        "untrained_trunk_and_embedder",
        "trained",
    ]
    assert all(0 <= r[MAP_R] <= 1 for r in table)
