"""The energy of the potential losses (Bhatnagar & Ahuja, CVPR 2025, Eq. 3-6): the per-point
energies E_a = sum_{b != a} phi(d_ab, l_a = l_b) of the P = B + N M points (the batch
embeddings, then the proxies class-major), computed as the paper's sum over all pairs (the
dense path) or by the plateau decomposition (the scalable path). See docs/derivations.md,
"The potential energy and its plateau decomposition"."""

from dataclasses import dataclass
from typing import Callable

import torch

from ...utils.loss_utils import index_counts
from .distances import PairSqDistances


@dataclass(frozen=True)
class PairPotential:
    """phi(d, same) as a function of sq = d^2: ``attraction`` for two points of one class,
    ``repulsion`` for two of different classes. Both are flat beyond their radius: the
    attraction is constant for d <= ``delta``, the repulsion for d >= ``repulsion_delta``;
    those constants are the *plateau* values."""

    attraction: Callable[[torch.Tensor], torch.Tensor]
    repulsion: Callable[[torch.Tensor], torch.Tensor]
    delta: float
    repulsion_delta: float

    def __call__(self, sq, same):
        # both potentials are clamped, so torch.where's gradient is clean (also at d = 0)
        return torch.where(same, self.attraction(sq), self.repulsion(sq))

    def plateaus(self, dtype, device):
        """attraction(delta^2) and repulsion(repulsion_delta^2), as tensors: the potentials
        evaluated on their plateau, so that potential - plateau is exactly 0 there."""
        inside = self.attraction(torch.tensor(self.delta**2, dtype=dtype, device=device))
        outside = self.repulsion(torch.tensor(self.repulsion_delta**2, dtype=dtype, device=device))
        return inside, outside

    def off_plateau(self, sq, same):
        """phi - plateau: exactly 0 for a pair on its plateau."""
        inside, outside = self.plateaus(sq.dtype, sq.device)
        # both branches are finite (clamped), so torch.where's gradient is clean
        return torch.where(same, self.attraction(sq) - inside, self.repulsion(sq) - outside)


# The dense path: the paper's sum as written


def pair_potential_matrix(points, point_labels, potential):
    """phi(d_ab, l_a = l_b) of all P x P ordered pairs (a, b), the squared distances from
    coordinate differences, and the mask of the same-class pairs."""
    sq = (points.unsqueeze(1) - points.unsqueeze(0)).pow(2).sum(dim=2)
    same = point_labels.unsqueeze(1) == point_labels.unsqueeze(0)
    return potential(sq, same), same


def dense_energies(phi):
    """E_a = sum_{b != a} phi_ab: the paper's U per evaluation point, without its constant self
    terms phi_aa = attraction(0) (no gradient)."""
    self_terms = torch.eye(len(phi), dtype=torch.bool, device=phi.device)
    return phi.masked_fill(self_terms, 0).sum(dim=1)


def off_plateau_pair_counts(phi, same, potential):
    """(same-class, different-class) unordered pairs off their plateau, from the dense path's
    phi matrix."""
    inside, outside = potential.plateaus(phi.dtype, phi.device)
    upper = torch.ones_like(same).triu(diagonal=1)
    off_plateau = upper & (phi != torch.where(same, inside, outside))
    return int((off_plateau & same).sum()), int((off_plateau & ~same).sum())


# The scalable path: the plateau decomposition
#
#   E_a = (n_{l_a} - 1) inside + (P - n_{l_a}) outside + sum_{b != a} [phi(d_ab, l_a = l_b) - plateau]
#
# (n_c: the points of class c). A term of the sum is exactly 0 unless its pair is off its plateau.


def scalable_energies(
    embeddings,
    num_proxies,
    point_labels,
    *,
    potential,
    pairs,
    same,
    points_with,
    proxies_per_class,
    chunk_entries,
    gather_entries,
    differences=None,
):
    """The same E_a as dense_energies, by the plateau decomposition: the plateau counts
    (plateau_energies) and the candidate pairs ``pairs`` (2, K) with their same-class mask
    ``same``: a superset of the pairs off their plateau (pair_energies). ``points_with``
    maps indices of the ``num_proxies`` learnable proxies to the pairs' points: the embeddings,
    then those proxies' points (the normalisation), with the gradients to both. The gradient
    goes through the proxies in some pair only: the others add exact zeros, so the backward
    pass does not touch them. ``differences``: a DifferencesBuffer for the pairs' coordinate
    differences (pair_energies), or None."""
    B, n = len(embeddings), num_proxies
    # the pairs' points: all embeddings, and only the proxies in some pair (in order)
    # (every point marked, the embeddings' marks dropped: no boolean mask, no Python value
    # copied to the device, which a GPU would wait for)
    used = torch.zeros(B + n, dtype=torch.bool, device=pairs.device).index_fill_(0, pairs.flatten(), True)
    rows = used[B:].nonzero().squeeze(1)
    points = points_with(rows)
    local = torch.empty_like(point_labels)
    local[:B] = torch.arange(B, device=local.device)
    local[B + rows] = torch.arange(B, len(points), device=local.device)
    off_plateau = pair_energies(
        points, local[pairs], same, potential, chunk_entries, gather_entries, differences
    )
    plateau = plateau_energies(point_labels, n // proxies_per_class, potential, embeddings.dtype)
    return torch.cat([plateau[:B] + off_plateau[:B], plateau[B:].index_add(0, rows, off_plateau[B:])])


def plateau_energies(point_labels, num_classes, potential, dtype):
    """Per point: every other point counted at its plateau value (no distance needed)."""
    inside, outside = potential.plateaus(dtype, point_labels.device)
    class_sizes = index_counts(point_labels, num_classes)[point_labels]
    same = (class_sizes - 1).to(dtype)
    return inside * same + outside * (len(point_labels) - 1 - same)


def pair_energies(points, pairs, same, potential, chunk_entries, gather_entries, differences=None):
    """Per point: the sum over the given pairs containing it of phi - plateau, each unordered
    pair added to both of its points (two ordered terms of U). In blocks of pairs of at most
    ``chunk_entries`` coordinates: with one block its coordinate differences are kept for the
    backward pass; with several, each block's are computed again in its backward pass
    (PairSqDistances' ``keep_differences``), so that memory holds one block's differences
    whatever the number of pairs (the other terms kept are a few numbers per pair). With no
    pairs at all, one empty block still runs, so that the energies depend on the points (zero
    gradients, as the dense path gives, not a value without a graph). ``differences``: a
    DifferencesBuffer to keep one block's differences in (else a new tensor)."""
    energies = points.new_zeros(len(points))
    step = max(1, chunk_entries // points.shape[1])
    keep_differences = pairs.shape[1] <= step
    for start in range(0, max(1, pairs.shape[1]), step):
        block, block_same = pairs[:, start : start + step], same[start : start + step]
        out = None
        if keep_differences and differences is not None:
            out = differences.take(block.shape[1], points)
        terms = block_energies(points, block, block_same, potential, gather_entries, keep_differences, out)
        energies = energies.index_add(0, block[0], terms).index_add(0, block[1], terms)
    return energies


def block_energies(points, pairs, same, potential, gather_entries, keep_differences=True, out=None):
    """phi - plateau of each of the (2, K) ``pairs``, from their coordinate differences
    (gathered ``gather_entries`` coordinates at a time; PairSqDistances, which keeps them in
    ``out`` if given)."""
    sq = PairSqDistances.apply(points, pairs, gather_entries, keep_differences, out)
    return potential.off_plateau(sq, same)
