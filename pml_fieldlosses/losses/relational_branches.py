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

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import ProxyAnchorLoss
from pytorch_metric_learning.reducers import DivisorReducer, MultipleReducers
from pytorch_metric_learning.utils import common_functions as c_f

from ..utils.loss_utils import log1p_sum_exp


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


def proxy_anchor_branches(losses, embeddings, labels, counts):
    """sum_k losses[k](embeddings[rows of k], labels[rows of k]) for ProxyAnchorLosses
    that pass batchable_proxy_anchor, without indices tuples, in one pass.

    embeddings (batch, E) and their int64 labels hold the samples of loss 0, then those
    of loss 1, ...: counts[k] > 0 rows each. The branches are laid side by side as a
    (K, M, ...) batch, M = max(counts), each padded with rows that every mask leaves
    out (as PML masks the absent pairs of one call), so each sample meets only its own
    branch's proxies and the work is that of the K calls. Each branch's pos_loss is
    divided by its own number of classes present, its neg_loss by num_classes, as
    PML's reducer does."""
    K, M, C = len(losses), max(counts), losses[0].num_classes
    alpha, margin = losses[0].alpha, losses[0].margin
    dtype, device = embeddings.dtype, embeddings.device
    for loss in losses:  # PML moves the proxies to the embeddings' dtype and device on each call
        loss.cast_types(dtype, device)
    sizes = torch.tensor(counts, device=device)
    branch = torch.repeat_interleave(torch.arange(K, device=device), sizes)
    row = torch.arange(len(embeddings), device=device) - (sizes.cumsum(0) - sizes)[branch]

    # both unit-normalised as PML's CosineSimilarity does on each call
    x = torch.nn.functional.normalize(embeddings, p=2, dim=1)
    proxies = torch.nn.functional.normalize(torch.stack([loss.proxies for loss in losses]), p=2, dim=2)
    padded = x.new_zeros(K, M, x.shape[1]).index_put((branch, row), x)
    cos = torch.bmm(padded, proxies.transpose(1, 2))  # (K, M, C)

    # the negatives: every (sample, proxy) pair of a branch but the sample's own label
    negative = torch.zeros(K, M, C, dtype=torch.bool, device=device)
    negative[branch, row] = True  # the rows of samples (the padding rows stay False)
    negative = negative.index_put((branch, row, labels), torch.tensor(False, device=device))
    # logsumexp over the samples, with PML's "+ 1" (a zero entry) and 0 for columns without one;
    # the positives (one per sample: its own label) as groups of B values, (branch, label), not
    # as a masked (K, M, C) logsumexp: B exponentials instead of two passes over K * M * C
    group = branch * C + labels
    pos_values = alpha * (margin - cos[branch, row, labels])
    pos_term = log1p_sum_exp(pos_values, group, K * C).view(K, C)
    neg_term = masked_logsumexp(alpha * (cos + margin), negative)

    # PML's DivisorReducer: pos_loss by the number of proxies with a positive sample (never 0
    # in a non-empty branch), neg_loss by num_classes; the two summed
    with_positives = torch.bincount(group, minlength=K * C).view(K, C).gt(0).sum(dim=1)
    return (pos_term.sum(dim=1) / with_positives + neg_term.sum(dim=1) / C).sum()


def masked_logsumexp(x, keep):
    """PML's lmu.logsumexp(x, keep_mask, add_one=True, dim=1) on (K, M, C), branch by branch:
    log(1 + sum of exp(x) over the kept entries of a column), 0 for a column with none. The
    same shift (the column's largest kept value, at least 0: the "+ 1"), written out so that
    the exponentials are taken once (torch.logsumexp takes them again in its backward) and
    without appending the row of zeros."""
    x = x.masked_fill(~keep, c_f.neg_inf(x.dtype))
    shift = x.detach().amax(dim=1).clamp_min(0)
    sums = torch.exp(x - shift.unsqueeze(1)).sum(dim=1)
    return shift + torch.log(torch.exp(-shift) + sums)
