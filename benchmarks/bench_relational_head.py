"""Training-step time of the DRML relational head next to a plain Linear embedder.

    python benchmarks/bench_relational_head.py                # B=180, 1024 -> 512, K=4, C=100, CPU
    python benchmarks/bench_relational_head.py --clock cpu    # one thread, its CPU time (shared machines)
    python benchmarks/bench_relational_head.py --device cuda --autocast float16
    python benchmarks/bench_relational_head.py --other ../an-older-checkout   # two versions, one process

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
* relational (--other): with --other FOLDER, the relational step of the pml_fieldlosses package
              in FOLDER (another version's checkout or git worktree, imported under another
              name), with this version's parameters copied into it; the script then prints
              this version's relational step over the other's, and whether both gave the
              same loss and gradients, bit for bit (a speed change that keeps the values)

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
import importlib
import statistics
import time

import device as bench_device  # this folder's device options (on sys.path as a script)
import torch
from bench_losses import make_inputs
from bench_versions import load_other
from pytorch_metric_learning import losses

from pml_fieldlosses.losses.relational_loss import RelationalLoss
from pml_fieldlosses.models import RelationalEmbedder


def relational_loss(args, loss_class):
    """The DRML-PA objective, of the given RelationalLoss class (this version's or another's)."""
    C, D, K = args.num_classes, args.embedding_size, args.num_branches
    return loss_class(
        losses.ProxyAnchorLoss(C, D),
        branch_losses=lambda: losses.ProxyAnchorLoss(C, D // K),
        num_branches=K,
        embedding_size=D,
    )


def build(args, other=None):
    """The timed steps by name, and the (head, loss) of each relational version; with ``other``
    (another version's package), also its relational step, on a copy of this version's
    parameters."""
    torch.manual_seed(0)
    C, D, K = args.num_classes, args.embedding_size, args.num_branches
    linear = torch.nn.Linear(args.in_features, D)
    linear_loss = losses.ProxyAnchorLoss(C, D)
    head = RelationalEmbedder(args.in_features, D, K)
    with torch.no_grad():  # a trained integrator: the relational path is not a no-op
        head.integrator.weight.add_(0.1 * torch.randn_like(head.integrator.weight))
    head_loss = relational_loss(args, RelationalLoss)
    modules = [linear, linear_loss, head, head_loss]
    versions = {"relational": (head, head_loss)}
    steps = {
        "linear": training_step(linear, linear_loss, args),
        "relational": training_step(head, head_loss, args),
        "relational head + base loss only": training_step(head, linear_loss, args),
        "linear (eval forward)": eval_forward(linear, args),
        "relational (eval forward)": eval_forward(head, args),
    }
    if other is not None:
        other_loss_module = importlib.import_module(f"{other.__name__}.losses.relational_loss")
        other_head = other.models.RelationalEmbedder(args.in_features, D, K)
        other_loss = relational_loss(args, other_loss_module.RelationalLoss)
        other_head.load_state_dict(head.state_dict())
        other_loss.load_state_dict(head_loss.state_dict())
        modules += [other_head, other_loss]
        steps["relational (--other)"] = training_step(other_head, other_loss, args)
        versions["relational (--other)"] = (other_head, other_loss)
    for m in modules:
        m.to(args.device)
    return steps, versions


def same_results(versions, args, features, labels):
    """Whether this version's relational step and the other's give the same loss and the same
    gradients (features and every parameter), bit for bit."""
    results = []
    for head, head_loss in versions.values():
        loss = training_step(head, head_loss, args)(features, labels)
        grads = [features.grad] + [p.grad for m in (head, head_loss) for p in m.parameters()]
        results.append((loss.detach(), [None if g is None else g.clone() for g in grads]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    return torch.equal(loss_a, loss_b) and all(
        (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
        for a, b in zip(grads_a, grads_b)
    )


def training_step(embedder, loss_fn, args):
    def step(features, labels):
        embedder.train()
        embedder.zero_grad(set_to_none=True)
        loss_fn.zero_grad(set_to_none=True)
        features.grad = None
        with bench_device.autocast(args):
            loss = loss_fn(embedder(features), labels)
        loss.backward()
        return loss

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
    parser.add_argument(
        "--other", metavar="FOLDER", help="a checkout of another version: its relational step too"
    )
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

    other = load_other(parser, args.other) if args.other else None
    steps, versions = build(args, other)
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
    if other is not None:
        ratio = statistics.median(times["relational"]) / statistics.median(times["relational (--other)"])
        same = same_results(versions, args, features, labels)
        print(
            f"relational / relational (--other): {ratio:.3f}; same loss and gradients: {'yes' if same else 'NO'}"
        )


if __name__ == "__main__":
    main()
