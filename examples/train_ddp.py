"""One training spread over several processes with torchrun: DDP + our DistributedLossWrapper.

    torchrun --standalone --nproc_per_node 2 examples/train_ddp.py                 # CPU: gloo
    torchrun --standalone --nproc_per_node 4 examples/train_ddp.py --device cuda   # one GPU per process: nccl
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \
        examples/train_ddp.py --device cuda                                        # two machines

The recipe of docs/distributed.md, as a complete program: the model in
``DistributedDataParallel``; the loss (PotentialFieldLoss by default: learnable proxies) in
our ``DistributedLossWrapper`` (PML's wrapper that gathers every rank's embeddings, plus the
world-size correction of the loss parameters' gradient) and in DDP too, so that the proxies
start equal on every rank and get the same averaged gradient; a ``DistributedSampler`` gives
each rank its part of every epoch. Rank 0 prints test MAP@R and P@1 before and after
training; at the end every rank checks that its loss parameters equal rank 0's bit for bit.

Data: a fixed synthetic task (no download, no extra package): NUM_CLASSES Gaussian classes
in 16 dimensions seen through a fixed random non-linear map to 64 dimensions, split by
sample into train and test. ``--out DIR`` saves each rank's loss parameters and the
accuracies (rank-<r>.pt, accuracies.json) for a test to read.
"""

import argparse
import json
import logging
import os

import torch
import torch.distributed as dist
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from pml_fieldlosses import losses
from pml_fieldlosses.utils.distributed import DistributedLossWrapper

NUM_CLASSES, SAMPLES_PER_CLASS, IN_DIM, EMBEDDING_SIZE = 32, 40, 64, 32
LOSSES = {
    "PotentialFieldLoss": lambda: losses.PotentialFieldLoss(NUM_CLASSES, EMBEDDING_SIZE, delta=0.4),
    "ContrastivePotentialLoss": lambda: losses.ContrastivePotentialLoss(NUM_CLASSES, EMBEDDING_SIZE, delta=0.4),
    "MeanFieldContrastiveLoss": lambda: losses.MeanFieldContrastiveLoss(NUM_CLASSES, EMBEDDING_SIZE),
    "MeanFieldClassWiseMultiSimilarityLoss": lambda: losses.MeanFieldClassWiseMultiSimilarityLoss(
        NUM_CLASSES, EMBEDDING_SIZE, alpha=2.0, beta=40.0, base=0.5
    ),
}


def synthetic_task(seed=0):
    """(train, test) TensorDatasets; the same on every rank (fixed seed, CPU generator)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(NUM_CLASSES, 16, generator=g)
    labels = torch.arange(NUM_CLASSES).repeat_interleave(SAMPLES_PER_CLASS)
    latent = centres[labels] + 0.9 * torch.randn(len(labels), 16, generator=g)
    mixing = torch.randn(16, IN_DIM, generator=g) / 4
    data = torch.tanh(latent @ mixing) + 0.05 * torch.randn(len(labels), IN_DIM, generator=g)
    test = torch.arange(len(labels)) % 4 == 0
    return TensorDataset(data[~test], labels[~test]), TensorDataset(data[test], labels[test])


@torch.no_grad()
def evaluate(model, dataset, device):
    model.eval()
    data, labels = dataset.tensors
    embeddings = model(data.to(device)).cpu()
    model.train()
    calculator = AccuracyCalculator(include=("mean_average_precision_at_r", "precision_at_1"), k="max_bin_count")
    accuracies = calculator.get_accuracy(embeddings, labels, embeddings, labels, ref_includes_query=True)
    return {"map_at_r": accuracies["mean_average_precision_at_r"], "p_at_1": accuracies["precision_at_1"]}


def same_on_every_rank(parameters):
    """True on every rank iff the flattened parameters equal rank 0's exactly."""
    flat = torch.cat([p.detach().reshape(-1) for p in parameters])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    equal = torch.tensor([int(torch.equal(flat, reference))], device=flat.device)
    dist.all_reduce(equal, op=dist.ReduceOp.MIN)
    return bool(equal.item())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loss", choices=list(LOSSES), default="PotentialFieldLoss")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--loss-lr", type=float, default=1e-2, help="for the loss's learnable parameters")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--out", help="folder for each rank's loss parameters and the accuracies")
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        parser.error("launch with torchrun, e.g. torchrun --standalone --nproc_per_node 2 examples/train_ddp.py")
    logging.getLogger("PML").setLevel(logging.WARNING)

    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    train_set, test_set = synthetic_task()
    torch.manual_seed(rank)  # different on every rank: DDP must make the parameters equal, not the seed
    model = torch.nn.Sequential(
        torch.nn.Linear(IN_DIM, 128), torch.nn.ReLU(), torch.nn.Linear(128, EMBEDDING_SIZE)
    ).to(device)
    loss_func = LOSSES[args.loss]().to(device)
    model = DDP(model, device_ids=[device] if device.type == "cuda" else None)
    wrapped_loss = DDP(DistributedLossWrapper(loss_func), device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    loss_optimizer = torch.optim.AdamW(wrapped_loss.parameters(), lr=args.loss_lr, weight_decay=1e-4)

    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    before = evaluate(model.module, test_set, device) if rank == 0 else None
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for data, labels in loader:
            loss = wrapped_loss(model(data.to(device)), labels.to(device))
            optimizer.zero_grad()
            loss_optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_optimizer.step()
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {loss.item():.4g}", flush=True)

    identical = same_on_every_rank(list(loss_func.parameters()) + list(model.module.parameters()))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        torch.save([p.detach().cpu() for p in loss_func.parameters()], os.path.join(args.out, f"rank-{rank}.pt"))
    if rank == 0:
        after = evaluate(model.module, test_set, device)
        print(f"{args.loss} on {world_size} processes: test MAP@R {before['map_at_r']:.3f} -> "
              f"{after['map_at_r']:.3f}   P@1 {before['p_at_1']:.3f} -> {after['p_at_1']:.3f}")
        print(f"loss and model parameters identical on all ranks: {identical}")
        if args.out:
            with open(os.path.join(args.out, "accuracies.json"), "w") as f:
                json.dump({"before": before, "after": after, "identical": identical}, f)

    del model, wrapped_loss  # the DDP modules go before the process group (docs/distributed.md)
    dist.barrier()
    dist.destroy_process_group()
    if not identical:
        raise SystemExit("the ranks' parameters differ")


if __name__ == "__main__":
    main()
