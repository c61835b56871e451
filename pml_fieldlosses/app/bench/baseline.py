"""The untrained row: the trunk with no training and no embedder (for a frozen
backbone: its standardised features), evaluated like a trained model."""

import time

import torch

from . import metrics
from .result import UNTRAINED, RunResult
from .run import make_tester, seed_everything


def untrained_test_embeddings(inputs, config, seed=0):
    """(embeddings, labels) of the test split for the untrained row's model of ``seed``."""
    seed_everything(seed)
    trunk = inputs.make_trunk().to(torch.device(config.device))
    embeddings, labels = make_tester(config.device).get_all_embeddings(
        inputs.eval_dataset("test"), trunk, torch.nn.Identity(), collate_fn=inputs.eval_collate
    )
    return embeddings.cpu().numpy(), labels.cpu().numpy()[:, 0]


def evaluate_untrained(seed, inputs, config):
    """The untrained row's RunResult for ``seed``."""
    start = time.perf_counter()
    seed_everything(seed)
    trunk = inputs.make_trunk().to(torch.device(config.device))
    tester = make_tester(config.device)
    data = {"val": inputs.eval_dataset("val"), "test": inputs.eval_dataset("test")}
    tester.test(
        data, 0, trunk, torch.nn.Identity(), [("val", ["val"]), ("test", ["test"])], inputs.eval_collate
    )
    val = metrics.level0(tester.all_accuracies["val"])[metrics.PRIMARY]
    return RunResult(
        loss=UNTRAINED,
        origin="baseline",
        seed=seed,
        test=metrics.level0(tester.all_accuracies["test"]),
        best_epoch=0,
        best_val_map_at_r=val,
        val_history={"epoch": [0], "map_at_r": [val]},
        label_noise={"fraction": config.label_noise, "changed": 0, "of": 0},
        run_seconds=time.perf_counter() - start,
    )
