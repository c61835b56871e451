"""Training-step time of the DRML relational head next to a plain Linear embedder.

    python benchmarks/bench_relational_head.py                # B=180, 1024 -> 512, K=4, C=100, CPU
    python benchmarks/bench_relational_head.py --clock cpu    # one thread, its CPU time (shared machines)
    python benchmarks/bench_relational_head.py --device cuda --autocast float16

What is compared: one training step without the optimiser, from trunk features
(requiring grad, as if a trunk produced them) to the backward of the loss, with
the same base loss on the embedder's output in both steps:

* linear:     Linear(in, out) + ProxyAnchorLoss(C, out): a Linear embedder's step, the baseline
* relational: RelationalEmbedder(in, out, K) + RelationalLoss(ProxyAnchorLoss(C, out),
              branch_losses: ProxyAnchorLoss(C, out / K), K, out), i.e. the DRML-PA objective:
              the same base loss on the head's output, plus what DRML adds (the K branch losses
              on the branch nodes and the reconstruction term); goal: <= 1.5x linear
* relational head + base loss only: the same head (training mode) + the linear step's
              ProxyAnchorLoss(C, out) on its output, without the branch and reconstruction
              terms (the head's own cost)
* linear / relational (eval forward): the embedder alone in eval mode, no grad (test-time cost)

Each step zeroes the gradients of its embedder, its loss and the features, then runs
the forward and the backward; all steps see the same features and labels. Under
--autocast the forward passes (embedder and loss) run in torch.autocast of that
dtype and the backward outside it; the parameters stay float32. Times are medians
over --reps interleaved rounds in one process, printed with their ratio to
"linear". On CUDA every clock read waits for the GPU. On a shared machine wall
times swing with the load of other processes; --clock cpu runs torch on one
thread and measures that thread's CPU time (time.thread_time), which other
processes barely disturb.
"""

import argparse
import statistics
import time

import device as bench_device  # this folder's device options (on sys.path as a script)
import torch
from bench_losses import make_inputs
from pytorch_metric_learning import losses

from pml_fieldlosses.losses.relational_loss import RelationalLoss
from pml_fieldlosses.models import RelationalEmbedder


def build(args):
    torch.manual_seed(0)
    C, D, K = args.num_classes, args.embedding_size, args.num_branches
    linear = torch.nn.Linear(args.in_features, D)
    linear_loss = losses.ProxyAnchorLoss(C, D)
    head = RelationalEmbedder(args.in_features, D, K)
    with torch.no_grad():  # a trained integrator: the relational path is not a no-op
        head.integrator.weight.add_(0.1 * torch.randn_like(head.integrator.weight))
    head_loss = RelationalLoss(
        losses.ProxyAnchorLoss(C, D),
        branch_losses=lambda: losses.ProxyAnchorLoss(C, D // K),
        num_branches=K,
        embedding_size=D,
    )
    modules = [linear, linear_loss, head, head_loss]
    for m in modules:
        m.to(args.device)
    return {
        "linear": training_step(linear, linear_loss, args),
        "relational": training_step(head, head_loss, args),
        "relational head + base loss only": training_step(head, linear_loss, args),
        "linear (eval forward)": eval_forward(linear, args),
        "relational (eval forward)": eval_forward(head, args),
    }


def training_step(embedder, loss_fn, args):
    def step(features, labels):
        embedder.train()
        embedder.zero_grad(set_to_none=True)
        loss_fn.zero_grad(set_to_none=True)
        features.grad = None
        with bench_device.autocast(args):
            loss = loss_fn(embedder(features), labels)
        loss.backward()

    return step


def eval_forward(embedder, args):
    def step(features, labels):
        embedder.eval()
        with torch.no_grad(), bench_device.autocast(args):
            embedder(features)

    return step


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, default=180)
    parser.add_argument("--in-features", type=int, default=1024)
    parser.add_argument("--embedding-size", type=int, default=512)
    parser.add_argument("--num-branches", type=int, default=4)
    parser.add_argument("--num-classes", type=int, default=100)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    bench_device.add_device_options(parser)
    args = parser.parse_args()
    device = bench_device.check_device(parser, args)
    if args.clock == "cpu":
        if device.type != "cpu":
            parser.error("--clock cpu measures CPU time: use it with --device cpu")
        args.threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)

    def clock():
        return time.thread_time() if args.clock == "cpu" else bench_device.clock(device)

    steps = build(args)
    features, labels = make_inputs(args.batch_size, args.num_classes, args.in_features, args.device)
    for step in steps.values():  # warm-up
        for _ in range(3):
            step(features, labels)
    times = {name: [] for name in steps}
    for _ in range(args.reps):
        for name, step in steps.items():
            start = clock()
            step(features, labels)
            times[name].append(clock() - start)

    print(
        f"B={args.batch_size}, {args.in_features} -> {args.embedding_size}, K={args.num_branches}, "
        f"C={args.num_classes}, {bench_device.describe(args)}, {args.clock} clock, "
        f"median of {args.reps} interleaved rounds"
    )
    baseline = statistics.median(times["linear"])
    print(f"{'step':<34}{'ms':>10}{'x linear':>10}")
    for name, t in times.items():
        median = statistics.median(t)
        print(f"{name:<34}{1000 * median:>10.3f}{median / baseline:>10.2f}")


if __name__ == "__main__":
    main()
