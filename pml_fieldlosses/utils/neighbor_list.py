"""Verlet neighbour list: the pairs of moving points that may be within a cutoff."""

import contextlib

import torch


@contextlib.contextmanager
def full_precision_matmul():
    """Float32 matrix products in full precision within the block: the
    rounding bounds of the searches (rounding_slack) assume float32 products,
    not TF32 or bfloat16 (``torch.set_float32_matmul_precision("high")``)."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def pair_sq_distances(points, pairs):
    """||p_i - p_j||^2 of the (2, K) ``pairs`` from the coordinate differences
    (exact near 0). The rows are gathered with F.embedding (= points[indices]),
    whose backward is much faster on CPU than index_select's for repeated
    indices."""
    ends = torch.nn.functional.embedding(pairs, points)
    return (ends[0] - ends[1]).pow(2).sum(dim=1)


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
    than ``cutoff``, kept exact while the points move, as in molecular dynamics,
    at a cost per update bounded by about one dense blocked search.

    Points come in groups of ``group_size`` consecutive points (point i is in
    group i // group_size); pairs within a group are never listed. Each point
    has a reference position (where it was when its pairs were last searched).
    The list holds every pair whose reference positions are closer than
    ``radius = cutoff + skin``, and each point i keeps a clearance r_i <= the
    reference distance to every point of another group *not* listed with it
    (so r_i >= radius). With s_i = r_i - cutoff and displacements
    disp_i = ||x_i - ref_i||, a pair outside the list is still
    >= max(r_i, r_j) - disp_i - disp_j apart (triangle inequality), which is
    >= cutoff if each of its points passes one of two tests: disp_i <= s_i / 2,
    or disp_i + (the largest displacement of any other point) <= s_i (one
    point moving alone may use its whole s_i). So the list is a superset of
    the pairs within ``cutoff``. Every update measures the displacements
    against the stored references and re-anchors the points that pass neither
    test at their current position: their rows are searched again against
    every point, the list and the clearances (theirs exactly, the others' as
    lower bounds) are updated, and so on until no point is left (the
    clearances of the others can only shrink). With uniform clearances this is
    the classic rule "rebuild when the two largest displacements exceed the
    skin", applied per point.

    Cost. A search computes distances as matrix products in blocks of at most
    ``chunk_entries`` entries (memory bounded), with a margin for rounding; a
    full search (a *build*) computes n (n - 1) / 2 of them: the dense
    computation. Computing the exact distance of a pair from its coordinates
    costs about ``pair_cost`` matrix-product entries (gathering rows is
    memory-bound; set by the dimension).
    A list is only worth keeping while it is sparse: it holds at most
    ``max_pairs`` = n (n - 1) / 2 / pair_cost pairs. A build whose pairs within
    the radius would exceed that *shrinks the skin* as it goes (to the radius
    that keeps the closest max_pairs / 2 pairs, the clearances of the dropped
    pairs' points lowered to their distances), so trained proxies that cluster
    around the cutoff (most pairs within cutoff + skin, few within the cutoff)
    keep a list of a smaller radius instead of losing it. Re-anchoring searches
    each point at most once per update (at most n^2 entries in all) and builds
    from scratch if the list outgrows ``max_pairs``. A build returns not the
    list but the pairs within ``cutoff`` of the current positions (read off the
    same matrix products), so an update costs at most about two or three dense
    searches' entries, and pair_cost per pair evaluated: the list's pairs that
    may now be within the cutoff (below).
    An update that would re-anchor more than half of the points
    (``max_reanchored``) builds instead: one search of every pair, which also
    chooses the skin again.

    Dense mode. A list whose skin would be too small for the points' motion (a
    point at the observed speed would be re-anchored within ``min_steps``
    updates, see below) is dropped: an update is then a *dense step*, one
    blocked search of the current positions that returns the pairs within the
    cutoff (no list, no clearances: n (n - 1) / 2 entries and pair_cost per
    pair within the cutoff, the dense computation's cost). It also counts the
    pairs by distance between the cutoff and cutoff + skin (a histogram read
    off the same products; pairs within a group count too, so the counts are
    upper bounds); once the largest skin whose list fits
    ``max_pairs`` is large enough for the motion again, it builds and keeps
    the list.

    Adaptive skin. ``skin`` is the largest skin; each build starts from
    ``2 * target_steps * speed`` within [skin / 16, skin], speed being the
    90th percentile of the points' displacements since the previous update
    (points that move little get a small radius, so the list stays sparse),
    and shrinks it further if the list would exceed ``max_pairs``; a list
    whose skin ends below ``2 * min_steps * speed`` is not kept. The skin
    changes only how much work is done, never the result (the clearances and
    displacements prove every unlisted pair out of the cutoff whatever the
    skin).

    Listed pairs. A listed pair is out of the cutoff while its reference
    distance minus both displacements is (``separation``), or while its
    distance when it was last evaluated minus the path lengths both points
    have moved since is: each point keeps an ``odometer`` (the sum of its
    displacements between updates) and each pair a ``bound`` (its distance at
    its last evaluation plus both odometers then), so the pair is safe while
    bound - odometer_i - odometer_j >= cutoff. Only pairs that fail both are
    evaluated from their coordinates, in blocks of ``gather_entries``
    coordinates (small blocks stay in the CPU's caches), which renews their
    bound; those within the cutoff are returned. Pairs of points that keep
    moving, pressed just outside the cutoff (trained proxies), are then
    evaluated every few updates instead of at every update until their points
    are re-anchored.

    ``last_searched`` (matrix-product entries), ``last_evaluated`` (pairs
    evaluated from coordinates, or read off a search's products) and
    ``last_returned`` (pairs) count the work of the last update. The first
    call, or any change of the number of points, group size, dtype, device,
    cutoff or largest skin, builds; so does the call after an update that
    raised (an out-of-memory error, say: the state is reset).

    Rounding. Every test against the cutoff keeps a margin for rounding: the
    searches' products (float32 products in full precision even where TF32
    is allowed) and the returned pairs' distances computed from coordinate
    differences err by less than their margins, and the certificates
    (clearances, separations, bounds) must exceed the cutoff by ``tolerance``,
    so every pair whose distance computed from coordinates is below the cutoff
    is returned.

    The list is a cache: displacements are measured against the stored
    references on every call, so in-place changes of the points between calls
    (optimiser steps, ``load_state_dict``) are always noticed; it holds no
    learnable state and is part of no ``state_dict``.
    """

    # the adaptive skin lets a point at the typical speed go about this many updates
    target_steps = 8
    # a list is kept only if its skin lets a point at the typical speed go this many updates
    min_steps = 2
    # an update that would re-anchor more than this fraction of the points builds instead
    max_reanchored = 0.5
    # resolution of the pair counts by distance in dense steps
    skin_bins = 64
    # gathered coordinates per block when listed pairs are evaluated
    gather_entries = 2**17

    def __init__(self, chunk_entries=2**22, pair_cost=None, adaptive_skin=True):
        self.chunk_entries = chunk_entries
        self.pair_cost = pair_cost  # None: default_pair_cost(dimension)
        self.adaptive_skin = adaptive_skin
        self.reset()
        self.num_builds = 0  # full searches
        self.num_dense_builds = 0  # full searches whose list was not kept
        self.num_dense_steps = 0  # updates without a kept list: one search at the cutoff
        self.num_partial_rebuilds = 0  # searches for a subset of re-anchored points
        self.num_reanchored = 0  # points re-anchored by partial rebuilds, in total
        self.last_reanchored = 0  # points searched by the last update (all of them on a build)
        self.last_searched = 0  # distance entries computed by matrix products in the last update
        self.last_evaluated = 0  # pairs evaluated by the last update
        self.last_returned = 0  # pairs returned by the last update

    @staticmethod
    def default_pair_cost(dim):
        """Gathering two rows and reducing their difference costs about this
        many matrix-product entries (measured on CPU: ~13 at D = 64, ~90 at
        D = 512, with the nonzero() of the blocked search included)."""
        return 8 + dim / 8

    def reset(self):
        self.reference = self.pairs = self.separation = self.bound = self.clearance = None
        self.previous = self.speed = self.odometer = None
        self.group_size = self.cutoff = self.max_skin = self.skin = None

    def update(self, points, group_size, cutoff, skin):
        """Returns a (2, K) int64 tensor of pairs (i < j) of points of different
        groups, containing every such pair whose current distance is below
        ``cutoff``."""
        try:
            with torch.no_grad(), full_precision_matmul():
                return self._update(points.detach(), group_size, cutoff, skin)
        except BaseException:
            self.reset()  # a half-made state could miss pairs: the next call builds
            raise

    def _update(self, points, group_size, cutoff, skin):
        self.last_reanchored = self.last_searched = self.last_evaluated = 0
        if self._stale(points, group_size, cutoff, skin):
            self.previous = self.speed = None
            self.odometer = torch.zeros(len(points), dtype=torch.float64, device=points.device)
            pairs = self._build(points, group_size, cutoff, skin)
        else:
            self._measure_speed(points)
            if self.pairs is None:
                pairs = self._dense_step(points)
            else:
                pairs = self._follow(points, cutoff)
        if self.last_reanchored == len(points) or self.pairs is None:
            # read off a search's products (with a margin): keep those within the cutoff by coordinates
            self.last_evaluated = pairs.shape[1]
            pairs = pairs[:, self._sq_distances(points, pairs) < cutoff**2 + squared_distance_slack(points)]
        self.previous = points.clone()
        self.last_returned = pairs.shape[1]
        return pairs

    def _measure_speed(self, points):
        """The 90th percentile of the displacements since the previous update;
        every point's odometer moves on by its displacement."""
        step = torch.linalg.vector_norm(points - self.previous, dim=1)
        self.speed = step.kthvalue(max(1, (9 * len(step) + 9) // 10)).values.item()
        # not in place: the state may have been made under torch.inference_mode()
        self.odometer = self.odometer + step.double() * (1 + self.tolerance(points))

    @staticmethod
    def tolerance(points):
        """Relative rounding margin of norms and distances computed in the
        points' dtype (a sum of D products errs by at most about D eps); the
        certificates must exceed the cutoff by this much."""
        return max(1e-4, 4 * (points.shape[1] + 2) * torch.finfo(points.dtype).eps)

    def choose_skin(self):
        """The skin a build starts from (see Adaptive skin)."""
        if not self.adaptive_skin or self.speed is None:
            return self.max_skin
        return min(self.max_skin, max(self.max_skin / 16, 2 * self.target_steps * self.speed))

    def smallest_skin(self):
        """The smallest skin worth keeping a list for: a point at the observed
        speed stays within its allowance for ``min_steps`` updates."""
        if not self.adaptive_skin or self.speed is None:
            return 0.0
        return 2 * self.min_steps * self.speed

    def _follow(self, points, cutoff):
        displacements = torch.linalg.vector_norm(points - self.reference, dim=1)
        while True:
            moved = self._beyond_allowance(displacements, cutoff)
            if not moved.any():
                return self._may_be_close(points, displacements, cutoff)
            if self.last_reanchored + moved.sum().item() > self.max_reanchored * len(points):
                return self._build(points, self.group_size, cutoff, self.max_skin)
            self._reanchor(points, moved)
            if self.pairs.shape[1] > self.max_pairs(points):
                return self._build(points, self.group_size, cutoff, self.max_skin)
            displacements = displacements.masked_fill(moved, 0.0)

    def _may_be_close(self, points, displacements, cutoff):
        """The listed pairs within the cutoff. A pair whose reference distance
        is >= separation is now >= separation - disp_i - disp_j apart, and one
        that was >= d apart at its last evaluation is now >= d - (the path
        lengths both points moved since) = bound - odometer_i - odometer_j
        (triangle inequality): a pair for which either is >= the cutoff adds an
        exact zero. The others are evaluated from their coordinates (in blocks),
        which renews their bound, and returned if within the cutoff."""
        tolerance = self.tolerance(points)
        reach = cutoff * (1 + tolerance)
        first, second = self.pairs
        moved = (displacements[first] + displacements[second]) * (1 + tolerance)
        odometers = self.odometer[first] + self.odometer[second]
        unsure = (self.separation - moved < reach) & (self.bound - odometers < reach)
        candidates = unsure.nonzero().squeeze(1)
        self.last_evaluated = len(candidates)
        if not len(candidates):
            return self.pairs.new_empty(2, 0)
        sq = self._sq_distances(points, self.pairs[:, candidates])
        renewed = sq.double().sqrt() * (1 - tolerance) + odometers[candidates]
        self.bound = self.bound.index_put((candidates,), renewed)  # not in place (inference mode)
        return self.pairs[:, candidates[sq < cutoff**2 + squared_distance_slack(points)]]

    def _sq_distances(self, points, pairs):
        """Squared distances of ``pairs`` from their coordinate differences, in
        blocks of ``gather_entries`` gathered coordinates."""
        step = max(1, self.gather_entries // points.shape[1])
        sq = [
            pair_sq_distances(points, pairs[:, start : start + step])
            for start in range(0, pairs.shape[1], step)
        ]
        return torch.cat(sq) if sq else points.new_empty(0)

    def _beyond_allowance(self, displacements, cutoff):
        """The points to re-anchor: an unlisted pair (i, j) is now at least
        max(r_i, r_j) - disp_i - disp_j apart, so it is out of the cutoff if
        either point passes one of two tests with its allowance a_i = r_i - cutoff:
        disp_i <= a_i / 2 (shared with every other point), or disp_i + the
        largest displacement of any other point <= a_i (a point may use its whole
        allowance while the others stay still). Points that pass neither are
        re-anchored. ``tolerance`` covers the rounding of the displacements and
        of the distances computed from coordinates."""
        tolerance = self.tolerance(self.reference)
        allowance = self.clearance - cutoff * (1 + tolerance)
        displacements = displacements * (1 + tolerance)
        top = displacements.topk(min(2, len(displacements))).values
        largest_other = torch.full_like(displacements, top[0].item())
        if len(top) > 1:
            largest_other[displacements.argmax()] = top[1]
        return (displacements > allowance / 2) & (displacements + largest_other > allowance)

    def _stale(self, points, group_size, cutoff, skin):
        ref = self.reference
        return (
            ref is None
            or ref.shape != points.shape
            or ref.dtype != points.dtype
            or ref.device != points.device
            or (self.group_size, self.cutoff, self.max_skin) != (group_size, cutoff, skin)
        )

    def max_pairs(self, points):
        """The most pairs a kept list may hold."""
        n = len(points)
        pair_cost = self.pair_cost if self.pair_cost is not None else self.default_pair_cost(points.shape[1])
        return int(n * (n - 1) / 2 / max(pair_cost, 1.0))

    def _build(self, points, group_size, cutoff, skin, fitting_skin=float("inf")):
        """A search of all pairs; its radius starts at cutoff + the skin chosen
        for the observed speed, at most ``fitting_skin``."""
        self.reference = points.clone()
        self.group_size, self.cutoff, self.max_skin = group_size, cutoff, skin
        self.skin = min(self.choose_skin(), fitting_skin)
        self.clearance = torch.full((len(points),), float("inf"), dtype=points.dtype, device=points.device)
        everyone = torch.arange(len(points), device=points.device)
        (self.pairs, self.separation), close = self._search(
            everyone, everyone.new_empty(0), self.max_pairs(points)
        )
        if self.pairs is not None:  # not evaluated yet: no bound
            self.bound = torch.full_like(self.separation, float("-inf"), dtype=torch.float64)
        self.num_builds += 1
        self.num_dense_builds += self.pairs is None
        self.last_reanchored = len(points)
        return close

    def _dense_step(self, points):
        """The pairs within the cutoff of the current positions, in blocks;
        builds (and keeps the list) instead once the largest skin whose pairs
        fit in a kept list is at least ``smallest_skin`` (the pairs are
        counted by distance, between the cutoff and the largest radius)."""
        n, groups = len(points), torch.arange(len(points), device=points.device) // self.group_size
        slack = squared_distance_slack(points)
        close_threshold = self.cutoff**2 + slack
        # radii from the cutoff to the largest radius in skin_bins equal steps; edges: their squares
        radii = (
            self.cutoff
            + self.max_skin * torch.arange(self.skin_bins + 1, dtype=torch.float64) / self.skin_bins
        )
        edges = (radii**2 + slack).tolist()
        counts = torch.zeros(self.skin_bins, dtype=torch.float64, device=points.device)
        left, right = self._augmented(points)
        step = self._block_rows(n)
        close = []
        for start in range(0, n, step):
            sq = left[start : start + step] @ right[start:].T
            self.last_searched += sq.numel()
            # the upper triangle: row start + r against column start + c with c > r
            upper = torch.ones_like(sq, dtype=torch.bool).triu(diagonal=1)
            row, col = ((sq < close_threshold) & upper).nonzero().unbind(1)
            keep = groups[row + start] != groups[col + start]
            close.append(torch.stack([row[keep], col[keep]]) + start)
            # the pairs within the cutoff count in the first bin
            sq = sq.masked_fill(~upper, float("inf")).clamp(min=edges[0])
            counts += torch.histc(sq, self.skin_bins, edges[0], edges[-1])
        self.num_dense_steps += 1
        fits = torch.cumsum(counts, 0) <= self.max_pairs(points)
        largest = radii[1:][fits.cpu()].max().item() - self.cutoff if fits.any() else 0.0
        if largest > 0 and min(largest, self.choose_skin()) >= self.smallest_skin():
            # from a skin whose pairs fit: the build need not shrink below smallest_skin
            return self._build(points, self.group_size, self.cutoff, self.max_skin, largest)
        return torch.cat(close, dim=1)

    def _block_rows(self, n):
        """Rows per block of a search of n points, each row against the later
        ones: at most ``chunk_entries`` entries, and at least 8 blocks, so the
        blocks cover about the upper triangle (n^2 / 2 entries plus one
        eighth of n^2 / 2) rather than the whole n x n square."""
        return max(1, min(self.chunk_entries // max(1, n), -(-n // 8)))

    @staticmethod
    def _augmented(points):
        """||a - b||^2 = [a, |a|^2, 1] . [-2b, 1, |b|^2]: one matrix product per block."""
        sq_norms = torch.linalg.vector_norm(points, dim=1, keepdim=True).square()
        ones = torch.ones_like(sq_norms)
        return torch.cat([points, sq_norms, ones], dim=1), torch.cat([-2 * points, ones, sq_norms], dim=1)

    def _reanchor(self, points, moved):
        anchored = moved.nonzero().squeeze(1)
        self.reference = torch.where(moved.unsqueeze(1), points, self.reference)
        self.clearance = self.clearance.masked_fill(moved, float("inf"))
        kept = ~(moved[self.pairs[0]] | moved[self.pairs[1]])
        (found, separation), _ = self._search(anchored, (~moved).nonzero().squeeze(1))
        self.pairs = torch.cat([self.pairs[:, kept], found], dim=1)
        self.separation = torch.cat([self.separation[kept], separation])
        self.bound = torch.cat(
            [self.bound[kept], torch.full_like(separation, float("-inf"), dtype=torch.float64)]
        )
        self.num_partial_rebuilds += 1
        self.num_reanchored += len(anchored)
        self.last_reanchored += len(anchored)

    def _search(self, rows, others, max_pairs=None):
        """Pairs within the radius (by reference positions) with at least one
        point in ``rows``: each row against the later rows and all ``others``.
        Lowers the clearances of all points to the distances seen. Returns
        those pairs and a lower bound of each one's reference distance, and,
        with ``max_pairs`` (a build), the pairs within the cutoff. With
        ``max_pairs``, a radius that would hold more pairs shrinks on the way
        (``_shrink``), and the list is given up (None, None) once its skin is
        below ``smallest_skin`` (or 1e-6 of the cutoff)."""
        order = torch.cat([rows, others])
        position = torch.empty_like(order)
        position[order] = torch.arange(len(order), device=order.device)
        ref = self.reference[order]
        groups = order // self.group_size
        slack = squared_distance_slack(ref)
        threshold = (self.cutoff + self.skin) ** 2 + slack
        close_threshold = self.cutoff**2 + slack
        left, right = self._augmented(ref)
        # the other members of each row's group, as positions in the order
        offsets = torch.arange(self.group_size, device=order.device)
        siblings = position[(groups * self.group_size).unsqueeze(1) + offsets]
        nearest = torch.full((len(order),), float("inf"), dtype=ref.dtype, device=ref.device)
        step = self._block_rows(len(order))
        found, found_sq, close = [], [], []
        for start in range(0, len(rows), step):
            stop = min(start + step, len(rows))
            # squared distances of rows start:stop to points start:, in the order
            sq = left[start:stop] @ right[start:].T
            self.last_searched += sq.numel()
            row, col = (sq < threshold).nonzero().unbind(1)
            keep = (col > row) & (groups[row + start] != groups[col + start])
            if found is not None:
                found.append(torch.stack([row[keep], col[keep]]) + start)
                found_sq.append(sq[row[keep], col[keep]])
            if max_pairs is not None:
                near = keep & (sq[row, col] < close_threshold)
                close.append(torch.stack([row[near], col[near]]) + start)
            # clearances: nearest point of another group that is not listed
            sq[row, col] = float("inf")
            sibling_rows, sibling_cols = self._local(siblings[start:stop] - start)
            sq[sibling_rows, sibling_cols] = float("inf")
            nearest[start:stop] = torch.minimum(nearest[start:stop], sq.amin(dim=1))
            nearest[start:] = torch.minimum(nearest[start:], sq.amin(dim=0))
            if found is not None and max_pairs is not None and sum(map(len, found_sq)) > max_pairs:
                found, found_sq, threshold = self._shrink(found, found_sq, nearest, max_pairs // 2, slack)
            if found is None:
                # no list: only the pairs within the cutoff are extracted from now on
                threshold = close_threshold
        lower_bound = (nearest - slack).clamp(min=0).sqrt()
        self.clearance[order] = torch.minimum(self.clearance[order], lower_bound)
        if found is None:
            return (None, None), self._ordered(order, close)
        separation = (torch.cat(found_sq) - slack).clamp(min=0).sqrt() if found else ref.new_empty(0)
        return (self._ordered(order, found), separation), self._ordered(order, close)

    def _shrink(self, found, found_sq, nearest, keep, slack):
        """The pairs found so far, cut to the ``keep`` closest ones: the radius
        (and ``skin``) shrink to the distance of the first dropped pair, and the
        dropped pairs' points lower their ``nearest`` (unlisted) distances.
        Returns the kept pairs and distances, and the new squared threshold;
        (None, None, threshold) when the skin falls below ``smallest_skin``
        (or 1e-6 of the cutoff)."""
        pairs, sq = torch.cat(found, dim=1), torch.cat(found_sq)
        threshold = sq.kthvalue(keep + 1).values.item() if keep < len(sq) else sq.max().item()
        dropped = sq >= threshold
        for ends in pairs[:, dropped]:
            nearest.scatter_reduce_(0, ends, sq[dropped], "amin")
        self.skin = max(threshold - slack, 0.0) ** 0.5 - self.cutoff
        if self.skin < max(self.smallest_skin(), 1e-6 * self.cutoff):
            return None, None, threshold
        return [pairs[:, ~dropped]], [sq[~dropped]], threshold

    @staticmethod
    def _ordered(order, found):
        """Local pair positions -> (2, K) point indices with i < j."""
        if found is None:
            return None
        pairs = order[torch.cat(found, dim=1)] if found else order.new_empty(2, 0)
        return torch.stack([pairs.min(dim=0).values, pairs.max(dim=0).values])

    @staticmethod
    def _local(columns):
        """(row, column) indices of the non-negative entries of ``columns``."""
        rows = torch.arange(len(columns), device=columns.device).unsqueeze(1).expand_as(columns)
        valid = columns >= 0
        return rows[valid], columns[valid]
