"""Verlet neighbour list: the pairs of moving points that may be within a cutoff."""

import torch


def squared_distance_slack(points):
    """An upper bound on the rounding error of ||a||^2 + ||b||^2 - 2 a.b computed
    in the points' dtype (see rounding_slack)."""
    max_norm = torch.linalg.vector_norm(points, dim=1).max().item() if len(points) else 0.0
    return rounding_slack(max_norm, points.shape[1], points.dtype)


def rounding_slack(max_norm, dim, dtype):
    """The bound of squared_distance_slack for points of norm <= ``max_norm`` in
    ``dim`` dimensions (a dot product of length D errs by at most about
    D * eps * ||a|| ||b||), with a safety factor of 2."""
    return 4 * (dim + 2) * torch.finfo(dtype).eps * max(max_norm**2, 1.0)


class NeighborList:
    """Unordered pairs (i < j) of points of different groups that may be closer
    than ``cutoff``, kept exact while the points move, as in molecular dynamics.

    Points come in groups of ``group_size`` consecutive points (point i is in
    group i // group_size); pairs within a group are never listed. Each point
    has a reference position (where it was when its pairs were last searched).
    The list holds every pair whose reference positions are closer than
    ``radius = cutoff + skin``, and each point i keeps a clearance r_i <= the
    reference distance to every point of another group *not* listed with it
    (so r_i >= radius). With s_i = r_i - cutoff and displacements
    disp_i = ||x_i - ref_i|| <= s_i / 2, a pair outside the list is still
    >= max(r_i, r_j) - disp_i - disp_j >= cutoff apart (triangle inequality),
    so the list is a superset of the pairs within ``cutoff``. Every update
    measures the displacements against the stored references and re-anchors the
    points with disp_i > s_i / 2 at their current position: their rows are
    searched again against every point, the list and the clearances (theirs
    exactly, the others' as lower bounds) are updated, and so on until no point
    is left (the clearances of the others can only shrink). Points that
    move little or sit far from other groups are never searched again; with
    uniform clearances this is the classic rule "rebuild when the two largest
    displacements exceed the skin", applied per point. The first call, or any
    change of the number of points, group size, dtype, device, cutoff or skin,
    searches all pairs. Searches compute distances in blocks of at most
    ``chunk_entries`` entries with a margin for rounding, so memory is bounded.

    The list is a cache: displacements are measured against the stored
    references on every call, so in-place changes of the points between calls
    (optimiser steps, ``load_state_dict``) are always noticed; it holds no
    learnable state and is part of no ``state_dict``.
    """

    def __init__(self, chunk_entries=2**22):
        self.chunk_entries = chunk_entries
        self.reset()
        self.num_builds = 0  # full searches
        self.num_partial_rebuilds = 0  # searches for a subset of re-anchored points
        self.num_reanchored = 0  # points re-anchored by partial rebuilds, in total
        self.last_reanchored = 0  # points searched by the last update (all of them on a build)

    def reset(self):
        self.reference = self.pairs = self.clearance = None
        self.group_size = self.cutoff = self.skin = None

    def update(self, points, group_size, cutoff, skin):
        """Returns a (2, K) int64 tensor of pairs (i < j) of points of different
        groups, containing every such pair whose current distance is below
        ``cutoff``."""
        with torch.no_grad():
            points = points.detach()
            self.last_reanchored = 0
            if self._stale(points, group_size, cutoff, skin):
                self._build(points, group_size, cutoff, skin)
                return self.pairs
            displacements = torch.linalg.vector_norm(points - self.reference, dim=1)
            # 1e-4 relative covers the rounding of the displacements themselves
            while True:
                moved = displacements * (1 + 1e-4) > (self.clearance - cutoff) / 2
                if not moved.any():
                    return self.pairs
                self._reanchor(points, moved)
                displacements = displacements.masked_fill(moved, 0.0)

    def _stale(self, points, group_size, cutoff, skin):
        ref = self.reference
        return (
            ref is None
            or ref.shape != points.shape
            or ref.dtype != points.dtype
            or ref.device != points.device
            or (self.group_size, self.cutoff, self.skin) != (group_size, cutoff, skin)
        )

    def _build(self, points, group_size, cutoff, skin):
        self.reference = points.clone()
        self.group_size, self.cutoff, self.skin = group_size, cutoff, skin
        self.clearance = torch.full((len(points),), float("inf"), dtype=points.dtype, device=points.device)
        everyone = torch.arange(len(points), device=points.device)
        self.pairs = self._search(everyone, everyone.new_empty(0))
        self.num_builds += 1
        self.last_reanchored = len(points)

    def _reanchor(self, points, moved):
        anchored = moved.nonzero().squeeze(1)
        self.reference = torch.where(moved.unsqueeze(1), points, self.reference)
        self.clearance = self.clearance.masked_fill(moved, float("inf"))
        kept = ~(moved[self.pairs[0]] | moved[self.pairs[1]])
        found = self._search(anchored, (~moved).nonzero().squeeze(1))
        self.pairs = torch.cat([self.pairs[:, kept], found], dim=1)
        self.num_partial_rebuilds += 1
        self.num_reanchored += len(anchored)
        self.last_reanchored += len(anchored)

    def _search(self, rows, others):
        """Pairs within the radius (by reference positions) with at least one
        point in ``rows``: each row against the later rows and all ``others``.
        Lowers the clearances of all points to the distances seen."""
        radius = self.cutoff + self.skin
        order = torch.cat([rows, others])
        position = torch.empty_like(order)
        position[order] = torch.arange(len(order), device=order.device)
        ref = self.reference[order]
        groups = order // self.group_size
        slack = squared_distance_slack(ref)
        threshold = radius**2 + slack
        # ||a - b||^2 = [a, |a|^2, 1] . [-2b, 1, |b|^2]: one matrix product per block
        sq_norms = torch.linalg.vector_norm(ref, dim=1, keepdim=True).square()
        ones = torch.ones_like(sq_norms)
        left = torch.cat([ref, sq_norms, ones], dim=1)
        right = torch.cat([-2 * ref, ones, sq_norms], dim=1)
        # the other members of each row's group, as positions in the order
        offsets = torch.arange(self.group_size, device=order.device)
        siblings = position[(groups * self.group_size).unsqueeze(1) + offsets]
        nearest = torch.full((len(order),), float("inf"), dtype=ref.dtype, device=ref.device)
        step = max(1, self.chunk_entries // max(1, len(order)))
        found = []
        for start in range(0, len(rows), step):
            stop = min(start + step, len(rows))
            # squared distances of rows start:stop to points start:, in the order
            sq = left[start:stop] @ right[start:].T
            row, col = (sq < threshold).nonzero().unbind(1)
            keep = (col > row) & (groups[row + start] != groups[col + start])
            found.append(torch.stack([row[keep], col[keep]]) + start)
            # clearances: nearest point of another group that is not listed
            sq[row, col] = float("inf")
            sibling_rows, sibling_cols = self._local(siblings[start:stop] - start)
            sq[sibling_rows, sibling_cols] = float("inf")
            nearest[start:stop] = torch.minimum(nearest[start:stop], sq.amin(dim=1))
            nearest[start:] = torch.minimum(nearest[start:], sq.amin(dim=0))
        lower_bound = (nearest - slack).clamp(min=0).sqrt()
        self.clearance[order] = torch.minimum(self.clearance[order], lower_bound)
        pairs = order[torch.cat(found, dim=1)] if found else order.new_empty(2, 0)
        return torch.stack([pairs.min(dim=0).values, pairs.max(dim=0).values])

    @staticmethod
    def _local(columns):
        """(row, column) indices of the non-negative entries of ``columns``."""
        rows = torch.arange(len(columns), device=columns.device).unsqueeze(1).expand_as(columns)
        valid = columns >= 0
        return rows[valid], columns[valid]
