"""Naive references of the mean-field papers' losses with explicit Python
loops over samples, classes and pairs. Slow on purpose; small inputs only.
Every function takes raw (unnormalised) tensors and returns a 0-dim tensor
built from scalar torch ops, so autograd gives the reference gradients."""

import torch


def nrm(v):
    return v / torch.clamp(torch.sqrt(torch.sum(v * v)), min=1e-12)


def cos(u, v):
    return torch.sum(nrm(u) * nrm(v))


def relu(t):
    return torch.clamp(t, min=0)


def softplus_beta(t, beta):
    # torch.nn.Softplus(beta): linear when beta * t > 20
    if beta * t > 20:
        return t
    return torch.log(1 + torch.exp(beta * t)) / beta


def mean_field_contrastive(x, y, W, pos_margin, neg_margin, mf_reg, mf_power, weights=None):
    """MeanFieldContrastive loss (Furusawa, ICLR 2024). x: (B, D), y: list of ints, W: (C, D) (row = class)."""
    B, C = len(y), W.shape[0]
    main = 0
    for i in range(B):
        w = 1.0 if weights is None else weights[i]
        for c in range(C):
            d = 1 - cos(x[i], W[c])
            if c == y[i]:
                main = main + w * relu(d - pos_margin)
            else:
                main = main + w * relu(neg_margin - d)
    main = main / B
    reg = 0
    if mf_reg != 0:
        for c in range(C):
            for k in range(C):
                if k != c:
                    reg = reg + relu(neg_margin - (1 - cos(W[c], W[k]))) ** mf_power
        reg = mf_reg * reg / C
    return main + reg


def class_wise_multi_similarity(x, y, alpha, beta, base, ref=None, ref_y=None, pairs=None):
    """ClassWiseMultiSimilarity loss (Furusawa, ICLR 2024). With ref/ref_y, j runs over the reference set. With `pairs`
    (a set of (i, j) tuples), the class means run over those pairs only."""
    if ref is None:
        ref, ref_y = x, y
    classes = sorted(set(y))
    ref_classes = sorted(set(ref_y))
    loss = 0
    for u in classes:
        terms = [
            torch.exp(-alpha * (cos(x[i], ref[j]) - base))
            for i in range(len(y))
            for j in range(len(ref_y))
            if y[i] == u and ref_y[j] == u and (pairs is None or (i, j) in pairs)
        ]
        if terms:
            loss = loss + torch.log(1 + sum(terms) / len(terms) / 2) / alpha
        for v in ref_classes:
            if v == u:
                continue
            terms = [
                torch.exp(beta * (cos(x[i], ref[j]) - base))
                for i in range(len(y))
                for j in range(len(ref_y))
                if y[i] == u and ref_y[j] == v and (pairs is None or (i, j) in pairs)
            ]
            if terms:
                loss = loss + torch.log(1 + sum(terms) / len(terms)) / (2 * beta)
    return loss / len(classes)


def mean_field_class_wise_multi_similarity(x, y, W, alpha, beta, base, mf_reg, mf_power, weights=None):
    """MeanFieldClassWiseMultiSimilarity loss (Furusawa, ICLR 2024). x: (B, D), y: list of ints, W: (C, D)."""
    B, C = len(y), W.shape[0]
    w = [1.0] * B if weights is None else weights
    n = [sum(1 for i in range(B) if y[i] == c) for c in range(C)]
    num_batch_classes = sum(1 for c in range(C) if n[c] > 0)

    def P(c):
        return sum(w[i] * torch.exp(-alpha * (cos(x[i], W[c]) - base)) for i in range(B) if y[i] == c) / max(
            n[c], 1
        )

    def Q(c, k):
        return sum(w[i] * torch.exp(beta * (cos(x[i], W[k]) - base)) for i in range(B) if y[i] == c) / max(
            n[c], 1
        )

    loss = 0
    for c in range(C):
        if n[c] > 0:
            loss = loss + torch.log(1 + P(c)) / (alpha * num_batch_classes)
    for c in range(C):
        for k in range(C):
            if c != k and (n[c] > 0 or n[k] > 0):
                loss = loss + torch.log(1 + Q(c, k) + Q(k, c)) / (2 * beta * num_batch_classes)
    if mf_reg != 0:
        reg = 0
        for c in range(C):
            for k in range(C):
                if k != c:
                    reg = reg + softplus_beta(cos(W[c], W[k]) - base, beta) ** mf_power
        loss = loss + mf_reg * reg / C
    return loss
