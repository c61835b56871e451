"""Train a small network with PotentialFieldLoss (PFML) and ContrastivePotentialLoss
(CPML) through PML's own trainer, with the paper's optimisers.

    python examples/train_potential_field.py [--loss PotentialFieldLoss] [--epochs 10]
        [--proxies-per-class 2] [--delta 0.2] [--alpha 4]

Data: scikit-learn's handwritten digits (8x8 images, offline), split by sample:
two thirds train, one third test, all ten classes in both. As in the paper, the
network and the proxies are trained with Adam, the proxies at 100x the
network's learning rate (paper: 5e-4 and 5e-2), through PML's
``metric_loss_optimizer``. Prints test MAP@R and P@1 before and after, and the
neighbour list's work.
"""

import argparse
import logging

import torch
from pytorch_metric_learning import samplers, testers, trainers
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from sklearn.datasets import load_digits

from pml_fieldlosses import losses

EMBEDDING_SIZE, NUM_CLASSES = 32, 10
LR = 1e-3
PROXY_LR_FACTOR = 100  # the paper's proxy learning rate: 100x the network's


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


def build_loss(name, args):
    kwargs = {"proxies_per_class": args.proxies_per_class, "delta": args.delta}
    if name == "PotentialFieldLoss":
        kwargs["alpha"] = args.alpha
    return getattr(losses, name)(NUM_CLASSES, EMBEDDING_SIZE, **kwargs)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = ["PotentialFieldLoss", "ContrastivePotentialLoss"]
    parser.add_argument("--loss", choices=names, nargs="+", default=names)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--proxies-per-class", type=int, default=2)
    parser.add_argument("--delta", type=float, default=0.2)
    parser.add_argument("--alpha", type=float, default=4.0, help="PotentialFieldLoss only")
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
        loss_func = build_loss(name, args)
        optimizers = {
            "trunk_optimizer": torch.optim.Adam(trunk.parameters(), lr=LR),
            "embedder_optimizer": torch.optim.Adam(embedder.parameters(), lr=LR),
            "metric_loss_optimizer": torch.optim.Adam(loss_func.parameters(), lr=LR * PROXY_LR_FACTOR),
        }
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
        neighbors = loss_func.neighbor_list
        print(
            f"{name:<26} test MAP@R {before[0]:.3f} -> {after[0]:.3f}   "
            f"P@1 {before[1]:.3f} -> {after[1]:.3f}   neighbour list: {neighbors.num_builds} build, "
            f"{neighbors.num_partial_rebuilds} partial rebuilds ({neighbors.num_reanchored} re-anchored)"
        )


if __name__ == "__main__":
    main()
