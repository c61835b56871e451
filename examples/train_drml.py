"""Train a trunk with the DRML relational head using PML's own trainer, tester and logging hooks.

    python examples/train_drml.py                          # ProxyAnchor as the base loss
    python examples/train_drml.py --base-loss triplet      # TripletMarginLoss + TripletMarginMiner
    python examples/train_drml.py --base-loss mfcont --epochs 10 --log-dir drml_logs

The data are synthetic (Gaussian classes in a low-dimensional subspace of noisy
inputs; validation on classes not seen in training), so the script runs in
seconds on a CPU. Swap in your own datasets and trunk: nothing else changes.
Logs (csv, sqlite, tensorboard) and the saved models go to --log-dir.
"""

import argparse
import logging

import torch
from pytorch_metric_learning import losses, miners, testers, trainers
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import logging_presets
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from pml_fieldlosses.losses import MeanFieldContrastiveLoss
from pml_fieldlosses.losses.relational_loss import RelationalLoss
from pml_fieldlosses.models import RelationalEmbedder

INPUT_SIZE, SIGNAL_SIZE, TRAIN_CLASSES, VAL_CLASSES = 64, 8, 20, 10
METRICS = ("mean_average_precision_at_r", "precision_at_1")


def synthetic_classes(first_class, num_classes, samples_per_class, seed):
    g = torch.Generator().manual_seed(seed)
    means = 2.0 * torch.randn(num_classes, SIGNAL_SIZE, generator=g)
    labels = torch.arange(num_classes).repeat_interleave(samples_per_class)
    signal = means[labels] + 0.5 * torch.randn(len(labels), SIGNAL_SIZE, generator=g)
    noise = torch.randn(len(labels), INPUT_SIZE - SIGNAL_SIZE, generator=g)
    return torch.utils.data.TensorDataset(torch.cat([signal, noise], dim=1), labels + first_class)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-loss", choices=["proxy_anchor", "mfcont", "triplet"], default="proxy_anchor")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--num-branches", type=int, default=4)
    parser.add_argument("--clip-grad-norm", type=float, default=None, help="clip the head's gradient norm")
    parser.add_argument("--log-dir", default="runs/drml_example")
    args = parser.parse_args()
    logging.getLogger("PML").setLevel(logging.WARNING)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    train_set = synthetic_classes(0, TRAIN_CLASSES, 64, seed=1)
    val_set = synthetic_classes(TRAIN_CLASSES, VAL_CLASSES, 32, seed=2)

    # the trunk ends in a feature vector; the head takes the place of a Linear(256, 128) embedder
    trunk = torch.nn.Sequential(torch.nn.Linear(INPUT_SIZE, 256), torch.nn.ReLU()).to(device)
    embedder = RelationalEmbedder(256, 128, args.num_branches).to(device)
    E = embedder.branch_size  # each branch's embedding size, 128 / num_branches

    mining_funcs = {}
    if args.base_loss == "proxy_anchor":  # DRML-PA: proxies per branch and for the full embedding
        base_loss = losses.ProxyAnchorLoss(TRAIN_CLASSES, 128, margin=0.2, alpha=64)
        branch_losses = lambda: losses.ProxyAnchorLoss(TRAIN_CLASSES, E, margin=0.2, alpha=64)
    elif args.base_loss == "mfcont":
        base_loss = MeanFieldContrastiveLoss(TRAIN_CLASSES, 128)
        branch_losses = lambda: MeanFieldContrastiveLoss(TRAIN_CLASSES, E)
    else:  # no parameters: the base loss serves the branches too; the miner's tuples are split by branch
        base_loss, branch_losses = losses.TripletMarginLoss(margin=0.2), None
        mining_funcs = {"tuple_miner": miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard")}
    # the loss needs no reference to the head: the head's training-mode output carries its branch
    # outputs (embeddings.branch_outputs); the loss only needs the head's shape
    metric_loss = RelationalLoss(
        base_loss,
        branch_losses,
        num_branches=args.num_branches,
        embedding_size=128,
        representation_weight=10,
    ).to(device)

    models = {"trunk": trunk, "embedder": embedder}
    optimizers = {
        "trunk_optimizer": torch.optim.AdamW(trunk.parameters(), lr=1e-3, weight_decay=1e-4),
        "embedder_optimizer": torch.optim.AdamW(embedder.parameters(), lr=1e-3, weight_decay=1e-4),
    }
    if list(metric_loss.parameters()):  # proxies / mean fields of the base and branch losses
        optimizers["metric_loss_optimizer"] = torch.optim.AdamW(metric_loss.parameters(), lr=1e-2)
    gradient_clippers = None
    if args.clip_grad_norm:
        gradient_clippers = {
            "embedder_grad_clipper": lambda: torch.nn.utils.clip_grad_norm_(
                embedder.parameters(), args.clip_grad_norm
            )
        }

    record_keeper, _, _ = logging_presets.get_record_keeper(
        f"{args.log_dir}/logs", f"{args.log_dir}/tensorboard"
    )
    hooks = logging_presets.get_hook_container(record_keeper)
    tester = testers.GlobalEmbeddingSpaceTester(
        end_of_testing_hook=hooks.end_of_testing_hook,
        dataloader_num_workers=0,
        accuracy_calculator=AccuracyCalculator(k="max_bin_count", include=METRICS),
    )
    end_of_epoch_hook = hooks.end_of_epoch_hook(tester, {"val": val_set}, f"{args.log_dir}/models")
    trainer = trainers.MetricLossOnly(
        models=models,
        optimizers=optimizers,
        batch_size=64,
        loss_funcs={"metric_loss": metric_loss},
        dataset=train_set,
        mining_funcs=mining_funcs,
        gradient_clippers=gradient_clippers,
        dataloader_num_workers=0,
        end_of_iteration_hook=hooks.end_of_iteration_hook,
        end_of_epoch_hook=end_of_epoch_hook,
    )

    def map_at_r():  # a tester without the logging hook, for the printout
        quiet = testers.GlobalEmbeddingSpaceTester(
            dataloader_num_workers=0,
            accuracy_calculator=AccuracyCalculator(k="max_bin_count", include=METRICS),
        )
        accuracies = quiet.test({"val": val_set}, 0, trunk, embedder)
        return accuracies["val"]["mean_average_precision_at_r_level0"]

    print(f"untrained: val MAP@R {map_at_r():.3f}")
    # DRML's warm-up: one epoch with the trunk frozen (head and proxies only), then everything
    trainer.freeze_these = ("trunk",)
    trainer.train(1, 1)
    trainer.freeze_these = ()
    c_f.set_requires_grad(trunk, requires_grad=True)
    trainer.train(2, args.epochs)
    print(f"trained {args.epochs} epochs ({args.base_loss}): val MAP@R {map_at_r():.3f}")
    print(f"logs and models in {args.log_dir}/")


if __name__ == "__main__":
    main()
