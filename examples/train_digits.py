"""Train a small network with each of our losses through PML's own trainer.

    python examples/train_digits.py                              # every loss
    python examples/train_digits.py --loss PotentialFieldLoss --epochs 20

Data: scikit-learn's handwritten digits (8x8 images, offline), split by sample:
two thirds train, one third test, all ten classes in both (ten classes are too
few for a class-disjoint split). The network is trained with AdamW; a loss's
learnable parameters get their own optimiser (PML's ``metric_loss_optimizer``)
at a multiple of the network's learning rate: the mean fields at 100x (the
official code uses 2000x with a 1e-4 network lr), the potential-field proxies at
100x (the PFML paper: Adam, 5e-4 for the network, 5e-2 for the proxies).
Prints test MAP@R and P@1 before and after training.
"""

import argparse
import logging

import torch
from pytorch_metric_learning import samplers, testers, trainers
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from sklearn.datasets import load_digits

from pml_fieldlosses import losses

EMBEDDING_SIZE, NUM_CLASSES, LR = 32, 10, 1e-3
LOSSES = {
    "MeanFieldContrastiveLoss": lambda: losses.MeanFieldContrastiveLoss(NUM_CLASSES, EMBEDDING_SIZE),
    "ClassWiseMultiSimilarityLoss": lambda: losses.ClassWiseMultiSimilarityLoss(
        alpha=2.0, beta=40.0, base=0.5
    ),
    "MeanFieldClassWiseMultiSimilarityLoss": lambda: losses.MeanFieldClassWiseMultiSimilarityLoss(
        NUM_CLASSES, EMBEDDING_SIZE, alpha=2.0, beta=40.0, base=0.5
    ),
    "PotentialFieldLoss": lambda: losses.PotentialFieldLoss(
        NUM_CLASSES, EMBEDDING_SIZE, delta=0.2, alpha=4.0
    ),
    "ContrastivePotentialLoss": lambda: losses.ContrastivePotentialLoss(
        NUM_CLASSES, EMBEDDING_SIZE, delta=0.2
    ),
}
LOSS_LR_FACTOR = 100  # learnable loss parameters: 100 x the network's learning rate


def digits_split():
    images, labels = load_digits(return_X_y=True)
    images = torch.tensor(images / 16.0, dtype=torch.float32)
    labels = torch.tensor(labels)
    train = torch.arange(len(labels)) % 3 != 0
    return (
        torch.utils.data.TensorDataset(images[train], labels[train]),
        torch.utils.data.TensorDataset(images[~train], labels[~train]),
    )


def evaluate(tester, test_set, trunk, embedder):
    accuracies = tester.test({"test": test_set}, 0, trunk, embedder)["test"]
    return accuracies["mean_average_precision_at_r_level0"], accuracies["precision_at_1_level0"]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--loss", choices=list(LOSSES), nargs="+", default=list(LOSSES))
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    logging.getLogger("PML").setLevel(logging.WARNING)
    train_set, test_set = digits_split()
    cpu = torch.device("cpu")
    tester = testers.GlobalEmbeddingSpaceTester(
        accuracy_calculator=AccuracyCalculator(
            include=("mean_average_precision_at_r", "precision_at_1"), k="max_bin_count"
        ),
        dataloader_num_workers=0,
        data_device=cpu,
    )
    for name in args.loss:
        torch.manual_seed(0)
        trunk = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128))
        embedder = torch.nn.Linear(128, EMBEDDING_SIZE)
        loss_func = LOSSES[name]()
        optimizers = {
            "trunk_optimizer": torch.optim.AdamW(trunk.parameters(), lr=LR, weight_decay=1e-4),
            "embedder_optimizer": torch.optim.AdamW(embedder.parameters(), lr=LR, weight_decay=1e-4),
        }
        if list(loss_func.parameters()):  # mean fields or proxies
            optimizers["metric_loss_optimizer"] = torch.optim.AdamW(
                loss_func.parameters(), lr=LR * LOSS_LR_FACTOR, weight_decay=1e-4
            )
        before = evaluate(tester, test_set, trunk, embedder)
        train_labels = train_set.tensors[1]
        trainer = trainers.MetricLossOnly(
            models={"trunk": trunk, "embedder": embedder},
            optimizers=optimizers,
            batch_size=64,
            loss_funcs={"metric_loss": loss_func},
            dataset=train_set,
            sampler=samplers.MPerClassSampler(train_labels, m=8, length_before_new_iter=len(train_labels)),
            dataloader_num_workers=0,
            data_device=cpu,
        )
        trainer.train(num_epochs=args.epochs)
        after = evaluate(tester, test_set, trunk, embedder)
        print(
            f"{name:<40} test MAP@R {before[0]:.3f} -> {after[0]:.3f}   P@1 {before[1]:.3f} -> {after[1]:.3f}"
        )


if __name__ == "__main__":
    main()
