"""RelationalLoss's ProxyAnchor terms computed together, where that is exact.

RelationalLoss calls its base loss on the embeddings and branch loss k on the nodes of
the samples assigned to branch k. With PML's ProxyAnchorLoss for these (DRML-PA, the
official code's main setting) each call does the same few dozen small operations, so
the K + 1 calls cost about K + 1 times PML's per-call overhead. ``proxy_anchor_terms``
gives the same values and gradients in one pass: each call is a group of rows of cosines
(the base loss's: every sample against its proxies; branch k's: each sample of branch k
against branch k's proxies), the groups are stacked, and each call's sums over its samples
are grouped reductions over the rows of its group (docs/models.md, "Speed").
"""

import collections
import math

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import ProxyAnchorLoss
from pytorch_metric_learning.reducers import DivisorReducer, MultipleReducers

from ..utils.loss_utils import UnitRows, grouped_exps, grouped_max, index_counts

PML_EPS = 1e-12  # the eps of torch.nn.functional.normalize, which PML's CosineSimilarity calls


def batchable_proxy_anchor(losses):
    """True if every loss in ``losses`` is a plain PML ProxyAnchorLoss at its defaults
    (cosine similarity, DivisorReducer, no regularizer, no statistics, no hooks), all
    with the same num_classes, margin and alpha: then proxy_anchor_terms computes
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


def proxy_anchor_terms(base_loss, embeddings, branch_losses, nodes, assignment, counts, labels):
    """(base_loss(embeddings, labels), sum over k of branch_losses[k](nodes of the samples of
    branch k, their labels)) in one pass, for ProxyAnchorLosses that pass
    batchable_proxy_anchor (the branch losses together), without indices tuples.

    base_loss is None (no base term: None is returned for it) or a ProxyAnchorLoss.
    branch_losses is a dict {k: the loss of branch k} of the branches with samples; empty:
    no branch term (None is returned for it). A branch left out is not called: its proxies
    get no gradient. nodes (batch, K, E), the int64 assignment (batch,) of each sample to its
    branch, the number of samples of each branch (a list) and the int64 labels (batch,) are
    those of RelationalLoss.

    Each loss call is a group of rows of cosines: the base loss's, each sample against the
    base proxies; branch k's, each sample of branch k (its own node) against branch k's
    proxies. The groups of the same num_classes (the base and branch losses of DRML-PA) are
    stacked and computed in one ProxyAnchorGroups pass."""
    device, dtype = nodes.device, nodes.dtype
    calls = []
    if base_loss is not None:
        base_loss.cast_types(dtype, device)  # PML does this on each call
        cosines = cosines_of(embeddings, base_loss.proxies)
        calls.append(Call(base_loss, cosines, labels, torch.zeros_like(labels), 1))
    if branch_losses:
        for loss in branch_losses.values():
            loss.cast_types(dtype, device)
        calls.append(branch_call(branch_losses, nodes, assignment, counts, labels))
    if len(calls) == 2 and calls[0].loss.num_classes == calls[1].loss.num_classes:
        calls = [stacked(*calls)]
    terms = [
        ProxyAnchorGroups.apply(
            call.cosines,
            call.labels,
            call.group,
            call.num_groups + 1,  # the padding rows' group, last, left out of every term
            call.alpha if call.alpha is not None else call.loss.alpha,
            call.margin if call.alpha is not None else call.loss.margin,
        )[:-1]
        for call in calls
    ]
    terms = torch.cat(terms) if len(terms) > 1 else terms[0]
    base_term = terms[0] if base_loss is not None else None
    branch_term = terms[int(base_loss is not None) :].sum() if branch_losses else None
    return base_term, branch_term


Call = collections.namedtuple(
    "Call", ["loss", "cosines", "labels", "group", "num_groups", "alpha", "margin"], defaults=(None, None)
)
Call.__doc__ = """Loss calls of proxy_anchor_terms, one per group of rows of cosines: a loss of
theirs (for num_classes), the cosines (rows, num_classes), the rows' labels, the group of
each row (num_groups for a padding row), the number of groups, and the alpha and margin of
each group and of the padding group (None: the loss's, for every group)."""


def branch_call(branch_losses, nodes, assignment, counts, labels):
    """The Call of the branch losses: group g's rows are the samples of the g-th branch in
    branch_losses (their own nodes, in batch order) against its proxies, from a (G, M, C)
    product of the branches side by side, M the size of the largest. A smaller branch is
    padded with copies of its last sample in the padding group, whose term is left out:
    their gradient is exactly 0."""
    device = nodes.device
    G, M = len(branch_losses), max(counts[k] for k in branch_losses)
    size = torch.tensor([counts[k] for k in branch_losses], device=device)
    start = size.cumsum(0) - size
    row = torch.arange(M, device=device)
    # (G, M): the sample in row r of group g (its last one on a padding row), then its node
    order = torch.argsort(assignment, stable=True)  # the samples grouped by branch, in batch order
    sample = order[start.unsqueeze(1) + torch.minimum(row, size.unsqueeze(1) - 1)]
    padded = nodes[sample, torch.tensor(list(branch_losses), device=device).unsqueeze(1)]
    proxies = torch.stack([loss.proxies for loss in branch_losses.values()])  # (G, C, E)
    cosines = cosines_of(padded, proxies).flatten(0, 1)  # (G * M, C)
    group = torch.arange(G, device=device).unsqueeze(1).expand(G, M).masked_fill(row >= size.unsqueeze(1), G)
    return Call(next(iter(branch_losses.values())), cosines, labels[sample.flatten()], group.flatten(), G)


def stacked(first, second):
    """One Call of the groups of the base loss's Call (first, no padding rows) and the branch
    losses' Call (second) of the same num_classes: the rows of the first, then of the second,
    its groups (and its padding group, last) numbered after the first's. Alpha and margin per
    group where the two losses' differ."""
    cosines = torch.cat([first.cosines, second.cosines])
    labels = torch.cat([first.labels, second.labels])
    group = torch.cat([first.group, second.group + first.num_groups])
    num_groups = first.num_groups + second.num_groups
    settings = [(float(call.loss.alpha), float(call.loss.margin)) for call in (first, second)]
    if settings[0] == settings[1]:
        return Call(first.loss, cosines, labels, group, num_groups)
    per_group = torch.tensor(
        [settings[0]] * first.num_groups + [settings[1]] * (second.num_groups + 1),
        dtype=cosines.dtype,
        device=cosines.device,
    )
    return Call(first.loss, cosines, labels, group, num_groups, per_group[:, 0], per_group[:, 1])


def cosines_of(samples, proxies):
    """PML's CosineSimilarity of samples and proxies: both unit-normalised (eps 1e-12), then
    their dot products, (samples, proxies); batched for (G, M, E) samples and (G, C, E)
    proxies (one batched product)."""
    return UnitRows.apply(samples, PML_EPS)[0].matmul(UnitRows.apply(proxies, PML_EPS)[0].transpose(-2, -1))


class ProxyAnchorGroups(torch.autograd.Function):
    """The ProxyAnchor terms (num_groups,) of a Call's groups of rows, from its (rows, C)
    cosines and the rows' labels, with a hand-written backward.

    Group g's term is PML's ProxyAnchorLoss on the rows of group g: on each column c,
    log(1 + sum over the group's rows of another label of exp(alpha (cos + margin))) and
    log(1 + sum over its rows of label c of exp(alpha (margin - cos))), as shifted sums over
    the group's rows; the pos terms summed and divided by the number of labels present in
    the group, the neg terms summed and divided by C. Every row has one positive (its label),
    so the sums over a group's rows are grouped sums of whole rows, with no mask: the
    positive's entry of the negatives is set to 0 by index. The backward reuses the forward's
    exponentials: d term / d cos is alpha * exp / denominator on a negative (over C) and
    -alpha * exp / denominator on a positive (over the labels present). Autograd through the
    plain ops takes about forty small steps for this. No double backward."""

    @staticmethod
    def forward(ctx, cos, labels, group, num_groups, alpha, margin):
        G, C = num_groups, cos.shape[1]
        rows = torch.arange(len(cos), device=cos.device)
        # alpha and margin: numbers, or one per group, then one per row (a column of factors)
        row_alpha, row_margin = alpha, margin
        if torch.is_tensor(alpha):
            row_alpha, row_margin = (
                alpha.index_select(0, group).unsqueeze(1),
                margin.index_select(0, group).unsqueeze(1),
            )
        # the negatives: per group and column, the shifted log(1 + sum of exp) over the group's
        # rows of another label (PML's logsumexp with add_one), the shift at least 0 (the "+ 1")
        values = row_alpha * (cos + row_margin)
        without_positives = values.detach().index_put((rows, labels), values.new_tensor(-math.inf))
        shift = grouped_max(without_positives, group, G)
        neg_exp = torch.exp(values - shift.index_select(0, group)).index_put_(
            (rows, labels), values.new_zeros(())
        )
        neg_denominator = torch.exp(-shift) + values.new_zeros(G, C).index_add_(0, group, neg_exp)
        neg_term = shift + torch.log(neg_denominator)
        # the positives: per group and label, the shifted log(1 + sum of exp) of its rows' values
        positive = group * C + labels
        pos_values = (row_alpha * (row_margin - cos[rows, labels].unsqueeze(1))).view(-1)
        pos_shift, pos_exp, pos_sums = grouped_exps(pos_values, positive, G * C)
        pos_denominator = torch.exp(-pos_shift) + pos_sums
        pos_term = (pos_shift + torch.log(pos_denominator)).view(G, C)
        # PML's DivisorReducer: pos_loss by the number of labels present (at least 1 in a group
        # with rows; a group without, such as an unused padding group, gives 0), neg_loss by C
        present = index_counts(positive, G * C).view(G, C).gt(0).sum(dim=1).clamp_min(1)
        ctx.save_for_backward(labels, group, neg_exp, neg_denominator, pos_exp, pos_denominator, present)
        ctx.alpha = alpha
        return pos_term.sum(dim=1) / present + neg_term.sum(dim=1) / C

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        labels, group, neg_exp, neg_denominator, pos_exp, pos_denominator, present = ctx.saved_tensors
        C = neg_exp.shape[1]
        scale = grad * ctx.alpha  # per group
        # neg_exp is 0 on the positives
        grad_cos = neg_exp * (scale.unsqueeze(1) / C / neg_denominator).index_select(0, group)
        positive = group * C + labels
        pos_weight = (
            (scale / present).index_select(0, group) * pos_exp / pos_denominator.index_select(0, positive)
        )
        grad_cos[torch.arange(len(labels), device=labels.device), labels] = -pos_weight
        return grad_cos, None, None, None, None, None
