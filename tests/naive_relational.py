"""Naive reference of RelationalLoss, the DRML objective (docs/models.md): each branch
loss on a stack of its samples' nodes, built with explicit loops over samples and branches."""

import torch


def naive_assignment(errors):
    """Branch of each sample: the smallest error, ties -> lowest index (explicit loops)."""
    assignment = []
    for b in range(errors.shape[0]):
        best = 0
        for k in range(1, errors.shape[1]):
            if errors[b, k] < errors[b, best]:
                best = k
        assignment.append(best)
    return assignment


def naive_restrict(indices_tuple, members):
    """Tuples (triplets or the two halves of a pair tuple) with all samples in members, re-indexed."""
    if indices_tuple is None:
        return None
    position = {b: i for i, b in enumerate(members)}
    groups = [indices_tuple] if len(indices_tuple) == 3 else [indices_tuple[:2], indices_tuple[2:]]
    restricted = []
    for group in groups:
        rows = [[int(x[t]) for x in group] for t in range(len(group[0]))]
        kept = [[position[s] for s in row] for row in rows if all(s in position for s in row)]
        for i in range(len(group)):
            restricted.append(torch.tensor([row[i] for row in kept], dtype=torch.long))
    return tuple(restricted)


def naive_relational_loss(loss_fn, embeddings, nodes, errors, labels, indices_tuple=None, branch_miner=None):
    """The loss built with loops: each branch loss on a stack of its samples' nodes."""
    B, num_branches = errors.shape
    assignment = naive_assignment(errors)
    total = 0
    for k in range(num_branches):
        members = [b for b in range(B) if assignment[b] == k]
        if not members:
            continue
        branch_nodes = torch.stack([nodes[b, k] for b in members])
        branch_labels = torch.tensor([int(labels[b]) for b in members])
        if branch_miner is not None:
            branch_tuple = branch_miner(branch_nodes, branch_labels)
        else:
            branch_tuple = naive_restrict(indices_tuple, members)
        total = total + loss_fn.branch_loss_of(k)(branch_nodes, branch_labels, branch_tuple)
    total = total + loss_fn.representation_weight * loss_fn.base_loss(embeddings, labels, indices_tuple)
    reconstruction = sum(errors[b, k] for b in range(B) for k in range(num_branches)) / (B * num_branches)
    return total + loss_fn.reconstruction_weight * reconstruction
