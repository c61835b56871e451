"""The search for the pairs of proxies of different classes that may be within the repulsion
radius: one interface (PairSearch), two implementations: DenseSearch (here: every update
searches all pairs) and NeighborList (neighbor_list.py: a Verlet list that is exact at a
fraction of that cost). See docs/derivations.md, "The pair search and the neighbour list's
certificates"."""

import functools
import math
from dataclasses import dataclass
from typing import Optional

import numpy
import torch

from .distances import (
    entries_below,
    full_precision_matmul,
    pair_sq_distances_in_blocks,
    row_blocks,
    squared_distance_slack,
)


@dataclass
class SearchStats:
    """Counts of a search's work. The ``last_*`` counts are of the last update (the losses'
    recordable statistics num_reanchored_proxies, num_searched_proxy_pairs and
    num_evaluated_proxy_pairs read them); the ``num_*`` counts add up over the search's life."""

    last_reanchored: int = 0  # points searched against all others by the last update (all on a build)
    last_searched: int = 0  # distance entries computed by matrix products in the last update
    last_evaluated: int = 0  # pairs evaluated from coordinates by the last update
    last_returned: int = 0  # pairs returned by the last update
    num_builds: int = 0  # full searches of a neighbour list
    num_dense_builds: int = 0  # full searches whose list was not kept
    num_dense_steps: int = 0  # updates without a kept list: one search at the cutoff
    num_partial_rebuilds: int = 0  # searches for a subset of re-anchored points
    num_reanchored: int = 0  # points re-anchored by partial rebuilds, in total

    def start_update(self):
        self.last_reanchored = self.last_searched = self.last_evaluated = 0


class PairSearch:
    """The unordered pairs (i < j) of points of different groups that may be closer than a
    cutoff. Points come in groups of ``group_size`` consecutive points (point i is in group
    i // group_size: the proxies of one class); pairs within a group are never returned.

    Distances are computed as matrix products in blocks of at most ``chunk_entries`` entries
    (bounded memory), float32 products in full precision, with a margin for rounding; the
    pairs so found are then evaluated from their coordinates in blocks of ``gather_entries``
    gathered coordinates. ``stats`` counts the work.
    """

    # gathered coordinates per block when pairs are evaluated from their coordinates
    gather_entries = 2**18

    def __init__(self, chunk_entries=2**22):
        self.chunk_entries = chunk_entries
        self.stats = SearchStats()

    def update(self, points, group_size, cutoff, skin, factors=None):
        """Returns a (2, K) int64 tensor of pairs (i < j) of points of different groups that
        contains every such pair whose distance computed from coordinates is below ``cutoff``.
        ``skin``: how far beyond the cutoff a search that keeps state may look. ``factors``:
        the points' Bfloat16Factors with every point a row, when the caller has them
        (``wants_factors``); a search may use them for bfloat16 products."""
        raise NotImplementedError

    def wants_factors(self):
        """Whether the next update would use the points' Bfloat16Factors (update's
        ``factors``)."""
        return False

    def within_cutoff(self, points, pairs, cutoff):
        """The ``pairs`` read off a search's products (with a margin) that are within the cutoff
        by their coordinates (with the same margin); they count as evaluated."""
        self.stats.last_evaluated = pairs.shape[1]
        sq = pair_sq_distances_in_blocks(points, pairs, self.gather_entries)
        return pairs[:, sq < cutoff**2 + squared_distance_slack(points)]


class DenseSearch(PairSearch):
    """Every update is one blocked search of all n (n - 1) / 2 pairs at the cutoff (the dense
    computation's cost), in float32: no state, ``skin`` and ``factors`` unused. The baseline of
    NeighborList, which does the same in its dense steps."""

    def update(self, points, group_size, cutoff, skin=0.0, factors=None):
        with torch.no_grad(), full_precision_matmul():
            points = points.detach()
            self.stats.start_update()
            no_bins = torch.tensor([cutoff], dtype=torch.float64)
            sweep = dense_sweep(points, group_size, cutoff, no_bins, self.chunk_entries)
            self.stats.last_searched = sweep.searched
            self.stats.num_dense_steps += 1
            pairs = self.within_cutoff(points, sweep.pairs, cutoff)
            self.stats.last_returned = pairs.shape[1]
            return pairs


@dataclass
class Sweep:
    """What dense_sweep found."""

    pairs: torch.Tensor  # (2, K) the pairs within the cutoff by the products (a superset: with the margin)
    searched: int  # entries computed
    # float64, the pairs counted by distance between consecutive radii; None if not counted
    counts: Optional[torch.Tensor]
    # the pairs the counts would put in the bins up to ``within_bin`` (once beyond the limit, some
    # number beyond it); None if not asked for
    within: Optional[int] = None


def dense_sweep(
    points, group_size, cutoff, radii, chunk_entries, factors=None, within_bin=None, within_limit=math.inf
):
    """One blocked search of all pairs (i < j) of points of different groups at ``cutoff``, with
    the rounding margin. From the same products, counts all pairs (i < j) of different groups by
    squared distance in ``len(radii) - 1`` equal bins between the squares of the first and last
    of ``radii`` (float64, increasing from radii[0] = cutoff; each with the margin): pairs within
    the cutoff count in the first bin, so the counts are upper bounds. One radius: no counts.
    ``within_bin``: instead of the counts (binning every entry costs about what the search
    does), only how many pairs they would put in the bins up to that one, ``within``, by one
    comparison (bin_threshold: cumsum(counts)[within_bin] exactly), counted until it passes
    ``within_limit`` (the rest of the blocks are not counted).
    ``factors``: the points' Bfloat16Factors (all of them as rows), for bfloat16 products: the
    pairs are read off and counted by lower bounds of their squared distances, tightest at the
    cutoff (row_blocks), so the pairs are still a superset and the counts upper bounds."""
    n = len(points)
    slack = squared_distance_slack(points)
    close_threshold = cutoff**2 + slack
    edges = (radii**2 + slack).tolist()
    bins = len(edges) - 1
    counts = torch.zeros(bins, dtype=torch.float64, device=points.device) if bins else None
    within = None
    if within_bin is not None:
        counts, within = None, 0
        below = bin_threshold(edges[0], edges[-1], bins, within_bin)
    close, searched = [], 0
    for start, sq, _ in row_blocks(points, n, chunk_entries, factors, close_threshold):
        searched += sq.numel()
        # only the pairs: row start + r against column start + c with c > r, of different groups
        width = min(len(sq) + group_size - 1, sq.shape[1])
        sq[:, :width].masked_fill_(
            not_pairs(len(sq), width, start % group_size, group_size, sq.device), math.inf
        )
        row, col = entries_below(sq, close_threshold)
        close.append(torch.stack([row, col]) + start)
        if within is not None and within <= within_limit:
            within += int((sq < below).sum())
        elif counts is not None:
            # the pairs within the cutoff count in the first bin
            counts += bin_counts(sq, edges[0], edges[-1], bins)
    return Sweep(torch.cat(close, dim=1), searched, counts, within)


@functools.lru_cache(maxsize=16)
def not_pairs(rows, width, offset, group_size, device):
    """(rows, width) bool: the entries of a block of a dense sweep (points in their own order,
    the first row at ``offset`` within its group) that are not pairs of a row with a later point
    of another group: the diagonal and below it, and the row's own group (within ``group_size``
    - 1 columns after the diagonal). Kept per shape: the same few blocks come at every step."""
    row = torch.arange(rows, device=device).unsqueeze(1)
    column = torch.arange(width, device=device).unsqueeze(0)
    return (column <= row) | ((offset + column) // group_size == (offset + row) // group_size)


def group_members(order, group_size):
    """(n, group_size): for the point at each place of a search's ``order`` (a permutation of
    the points, numbered in groups of ``group_size``), the places of its group's members
    (itself included)."""
    position = torch.empty_like(order)
    position[order] = torch.arange(len(order), device=order.device)
    offsets = torch.arange(group_size, device=order.device)
    return position[(order // group_size * group_size).unsqueeze(1) + offsets]


def mask_own_groups(sq, start, members):
    """Sets to inf the entries of a block of a search (the point at start + r against the point
    at start + c) of each row with the members of its group (``members``: group_members, in the
    search's order): never pairs, and often close, so that without them a row with no pair
    below a threshold has its minimum above it, and the search skips it (entries_below).
    Members placed before the block (in none of its columns) write the row's own entry
    instead, which is set anyway: one scatter, no boolean mask (which a GPU waits for)."""
    columns = members[start : start + len(sq)] - start
    own = torch.arange(len(sq), device=sq.device).unsqueeze(1).expand_as(columns)
    sq.scatter_(1, torch.where(columns >= 0, columns, own), math.inf)


def bin_positions(values, low, high, bins):
    """Where float32 ``values`` fall in ``bins`` equal bins between ``low`` and ``high``: value v
    is in bin floor(position) (below 0: the first; from ``bins`` on, inf and NaN: none), in
    float32 arithmetic. Overwrites ``values``."""
    return values.nan_to_num_(nan=math.inf, posinf=math.inf).sub_(low).mul_(bins / (high - low))


@functools.lru_cache(maxsize=64)
def bin_threshold(low, high, bins, bin):
    """The smallest float32 value whose position (bin_positions, float32 arithmetic) is at least
    ``bin`` + 1, for ``low`` > 0: a float32 value is in a bin up to ``bin`` exactly when it is
    below it, so one comparison counts them. The position only grows with the value (each
    float32 operation rounds monotonically), so a bisection over the positive float32 values
    (whose bit patterns are in the same order) finds it; numpy's float32 arithmetic rounds as
    torch's does."""
    low32, scale32 = numpy.float32(low), numpy.float32(bins / (high - low))

    def position(bits):
        return (numpy.array(bits, dtype=numpy.int32).view(numpy.float32) - low32) * scale32

    below, beyond = 0, int(numpy.array(numpy.inf, dtype=numpy.float32).view(numpy.int32))
    while beyond - below > 1:  # position(below) < bin + 1 <= position(beyond)
        middle = (below + beyond) // 2
        below, beyond = (middle, beyond) if position(middle) < bin + 1 else (below, middle)
    return float(numpy.array(beyond, dtype=numpy.int32).view(numpy.float32))


def bin_counts(values, low, high, bins):
    """How many ``values`` fall in each of ``bins`` equal bins between ``low`` and ``high``, those
    below ``low`` in the first, those from ``high`` on and NaN in none (float64): torch.histc's
    binning, twice as fast on CPU (one scaling, one bincount). Overwrites ``values``."""
    index = bin_positions(values, low, high, bins).clamp_(0, bins).long()
    return torch.bincount(index.view(-1), minlength=bins + 1)[:bins].to(torch.float64)


class ListChoice:
    """For few points (a loss's ``all_pairs_entries``), whether the proxies' pairs of different
    classes are found by the neighbour list or by one search of all pairs, the embeddings' and
    the proxies' in one product (candidates.embedding_candidates). The list costs a small share
    of a search of all proxy pairs while the proxies move little against its skin, and more
    than the one product once they press against each other's radius (it re-anchors many of
    them at every update, or gives itself up for dense steps). So the list is followed while
    its work per update (``observe``: entries searched plus ``pair_cost`` per pair evaluated, as
    a share of the n (n - 1) / 2 entries of a search of all proxy pairs) averages at most
    ``max_work`` over its last ``window`` updates, leaving out its first one (the build each
    switch to it costs); then all pairs are searched, and the list is taken up again after
    ``retry`` updates, twice as many after each time it was given up within ``2 window``
    updates of being taken up, up to ``max_retry``. Either way the candidates are a superset of
    the pairs off their plateau: the choice changes the work, never the loss. With bfloat16
    products (``observe``'s ``bfloat16``) an entry costs about a quarter of a float32 one
    (Bfloat16Choice), and so does the search of all pairs against the list's other work: the
    list is then followed while its work averages at most ``max_work / 4``. See
    docs/performance-log.md, "A third day: the start window's pairs, float32 searches, the list
    for few points"."""

    max_work = 0.25
    window = 8
    retry = 16
    max_retry = 1024

    def __init__(self):
        self.following = True  # the list (else the search of all pairs)
        self.updates = 0  # updates since the last switch
        self.works = []  # the list's work at its last updates (at most ``window``)
        self.wait = self.retry  # updates of the search of all pairs before the list is taken up again

    def use_list(self):
        """Whether the next update follows the list."""
        if not self.following and self.updates >= self.wait:
            self.following, self.updates, self.works = True, 0, []
        return self.following

    def observe(self, work=None, bfloat16=False):
        """After an update: the list's ``work`` (a share of a search of all proxy pairs), or
        None after a search of all pairs; ``bfloat16``: whether the searches multiply in
        bfloat16."""
        self.updates += 1
        if not self.following or self.updates == 1:  # (the list's first update: its build)
            return
        self.works = [*self.works, work][-self.window :]
        max_work = self.max_work / 4 if bfloat16 else self.max_work
        if len(self.works) == self.window and sum(self.works) > max_work * self.window:
            given_up_soon = self.updates <= 2 * self.window
            self.wait = min(2 * self.wait, self.max_retry) if given_up_soon else self.retry
            self.following, self.updates = False, 0
