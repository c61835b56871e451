"""The branch losses of RelationalLoss computed together, where that is exact.

RelationalLoss calls branch loss k on the nodes of the samples assigned to
branch k. With PML's ProxyAnchorLoss as the branch loss (DRML-PA, the official
code's main setting) each call does the same few dozen small operations on
about batch_size / K samples, so K calls cost about K times PML's per-call
overhead. ``proxy_anchor_branches`` gives the same value and gradients with
one pass over all branches: each sample against the proxies of every branch
at once, with every entry outside the sample's own branch masked out of the
sums over samples (docs/models.md, "Speed").
"""

import collections

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import ProxyAnchorLoss
from pytorch_metric_learning.reducers import DivisorReducer, MultipleReducers
from pytorch_metric_learning.utils import common_functions as c_f

from ..utils.loss_utils import grouped_exps, index_counts, unit_rows, unit_rows_backward

PML_EPS = 1e-12  # the eps of torch.nn.functional.normalize, which PML's CosineSimilarity calls


def batchable_proxy_anchor(losses):
    """True if every loss in ``losses`` is a plain PML ProxyAnchorLoss at its defaults
    (cosine similarity, DivisorReducer, no regularizer, no statistics, no hooks), all
    with the same num_classes, margin and alpha: then proxy_anchor_branches computes
    exactly what calling each of them computes. Anything else is called loss by loss."""
    if not losses:
        return False
    first = losses[0]
    return all(
        type(loss) is ProxyAnchorLoss
        and loss.num_classes == first.num_classes
        and loss.margin == first.margin
        and loss.alpha == first.alpha
        and type(loss.distance) is CosineSimilarity
        and loss.distance.p == 2
        and loss.distance.power == 1
        and type(loss.reducer) is MultipleReducers
        and set(loss.reducer.reducers) == {"pos_loss", "neg_loss"}
        and all(type(reducer) is DivisorReducer for reducer in loss.reducer.reducers.values())
        and loss.weight_regularizer is None
        and loss.embedding_regularizer is None
        and not any(
            m.collect_stats for m in (loss, loss.distance, loss.reducer, *loss.reducer.reducers.values())
        )
        and not (loss._forward_hooks or loss._forward_pre_hooks or loss._backward_hooks)
        for loss in losses
    )


def proxy_anchor_branches(losses, nodes, labels, order, branches, counts):
    """sum_k losses[k](nodes of the samples of branches[k], their labels) for ProxyAnchorLosses
    that pass batchable_proxy_anchor, without indices tuples, in one pass.

    nodes (batch, num_branches, E) and their int64 labels (batch,) are those of
    RelationalLoss.branch_loss; order lists the samples grouped by branch (batch order
    within a branch): those of branches[0] (counts[0] > 0 of them), then those of
    branches[1], ... Each sample's own node (that of its branch) is gathered straight into a
    (K, M, E) batch, M = max(counts), one row per sample of the branch, so each sample meets
    only its own branch's proxies and the work is that of the K calls. A branch with fewer
    than M samples is padded with copies of its last sample that every mask leaves out (as
    PML masks the absent pairs of one call): their gradient is exactly 0. Each branch's
    pos_loss is divided by its own number of classes present, its neg_loss by num_classes,
    as PML's reducer does."""
    K, M, C = len(losses), max(counts), losses[0].num_classes
    device = nodes.device
    for loss in losses:  # PML moves the proxies to the embeddings' dtype and device on each call
        loss.cast_types(nodes.dtype, device)
    sizes = torch.tensor(counts, device=device)
    starts = sizes.cumsum(0) - sizes
    rows = torch.arange(M, device=device)
    # (K, M): the sample in row r of branch k (the last one for a padding row) and its node
    samples = order[starts.unsqueeze(1) + torch.minimum(rows, sizes.unsqueeze(1) - 1)]
    padded = nodes[samples, torch.tensor(branches, device=device).unsqueeze(1)]
    proxies = torch.stack([loss.proxies for loss in losses])

    # the negatives: every (sample, proxy) pair of a branch but the sample's own label
    is_sample = rows < sizes.unsqueeze(1)  # (K, M): False on the padding rows
    negative = is_sample.unsqueeze(2) & (labels[samples].unsqueeze(2) != torch.arange(C, device=device))
    # the positives (one per sample: its own label) as groups of B values, (branch, label), not
    # as a masked (K, M, C) logsumexp: B exponentials instead of two passes over K * M * C
    branch = torch.repeat_interleave(torch.arange(K, device=device), sizes)
    row = torch.arange(len(order), device=device) - starts[branch]
    label = labels[order]
    group = branch * C + label
    # PML's DivisorReducer: pos_loss by the number of proxies with a positive sample (never 0
    # in a non-empty branch), neg_loss by num_classes
    with_positives = index_counts(group, K * C).view(K, C).gt(0).sum(dim=1)
    positives = Positives(branch, row, label, group, with_positives)
    return ProxyAnchorBranches.apply(padded, proxies, negative, positives, losses[0].alpha, losses[0].margin)


Positives = collections.namedtuple("Positives", ["branch", "row", "label", "group", "per_branch"])
Positives.__doc__ = """Where the positive pairs of proxy_anchor_branches lie: sample i is row row[i]
of branch branch[i] with label label[i], in group = branch * C + label; per_branch (K,) is the
number of groups with a sample in each branch."""


class ProxyAnchorBranches(torch.autograd.Function):
    """The K ProxyAnchor losses of proxy_anchor_branches on the padded (K, M, E) samples and
    the (K, C, E) proxies, with a hand-written backward.

    The same values as the plain ops (both sides unit-normalised as PML's CosineSimilarity
    does, their (K, M, C) cosines, the logsumexps over the samples); the backward reuses
    the forward's exponentials: d loss / d cos is alpha * exp / denominator on each
    negative (divided by C) and -alpha * exp / denominator on each positive (divided by
    its branch's number of groups), then two batched products and the normalisations'
    backward. Autograd through the plain ops takes about 40 small steps over (K, M, C)
    and (K, C, E) tensors for this; the loss is a few per cent of a training step, and
    those steps were most of its cost. No double backward."""

    @staticmethod
    def forward(ctx, padded, proxies, negative, positives, alpha, margin):
        x, x_norms = unit_rows(padded, PML_EPS)
        p, p_norms = unit_rows(proxies, PML_EPS)
        cos = torch.bmm(x, p.transpose(1, 2))  # (K, M, C)
        K, _, C = cos.shape
        # the negatives: log(1 + sum over a column's negatives of exp(alpha (cos + margin)))
        neg_shift, neg_exp, neg_denominator = masked_exp_sums(alpha * (cos + margin), negative)
        neg_term = neg_shift + torch.log(neg_denominator)
        # the positives: log(1 + sum over a group's samples of exp(alpha (margin - cos)))
        positions = (positives.branch, positives.row, positives.label)
        pos_values = alpha * (margin - cos[positions])
        pos_shift, pos_exp, pos_sums = grouped_exps(pos_values, positives.group, K * C)
        pos_denominator = torch.exp(-pos_shift) + pos_sums
        pos_term = (pos_shift + torch.log(pos_denominator)).view(K, C)
        ctx.save_for_backward(x, x_norms, p, p_norms, neg_exp, neg_denominator, pos_exp, pos_denominator)
        ctx.positives, ctx.alpha = positives, alpha
        return (pos_term.sum(dim=1) / positives.per_branch + neg_term.sum(dim=1) / C).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, x_norms, p, p_norms, neg_exp, neg_denominator, pos_exp, pos_denominator = ctx.saved_tensors
        positives, alpha = ctx.positives, ctx.alpha
        C = p.shape[1]
        # neg_exp is 0 off the negatives (the masked entries, the positives and the padding rows)
        grad_cos = neg_exp * (grad * alpha / C / neg_denominator).unsqueeze(1)
        pos_weight = pos_exp / pos_denominator[positives.group] / positives.per_branch[positives.branch]
        grad_cos[positives.branch, positives.row, positives.label] = -grad * alpha * pos_weight
        grad_padded = grad_proxies = None
        if ctx.needs_input_grad[0]:
            grad_padded = unit_rows_backward(torch.bmm(grad_cos, p), x, x_norms, PML_EPS)
        if ctx.needs_input_grad[1]:
            grad_proxies = unit_rows_backward(torch.bmm(grad_cos.transpose(1, 2), x), p, p_norms, PML_EPS)
        return grad_padded, grad_proxies, None, None, None, None


def masked_exp_sums(x, keep):
    """log(1 + sum over dim 1 of exp(x) where keep) of a (K, M, C) x, PML's logsumexp with
    add_one over each branch's samples (0 for a column with no kept entry), in parts:
    shift + log(denominator), with shift (K, C) the column's largest kept value, at least 0
    (the "+ 1"), exps (K, M, C) exp(x - shift) on the kept entries and 0 elsewhere, and
    denominator exp(-shift) + the column's sum of exps. The exponentials are taken once, for
    the forward and the backward."""
    x = x.masked_fill(~keep, c_f.neg_inf(x.dtype))
    shift = x.detach().amax(dim=1).clamp_min(0)
    exps = torch.exp(x - shift.unsqueeze(1))
    return shift, exps, torch.exp(-shift) + exps.sum(dim=1)
