"""Verlet neighbour list: the pairs of moving points that may be within a cutoff, kept exact
while the points move, as in molecular dynamics. See docs/derivations.md, "The pair search and
the neighbour list's certificates"."""

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .distances import (
    Bfloat16Choice,
    Bfloat16Factors,
    entries_below,
    full_precision_matmul,
    kept_buffer,
    pair_sq_distances_in_blocks,
    rounding_slack,
    row_blocks,
    squared_distance_slack,
)
from .pair_search import PairSearch, dense_sweep, group_members, mask_own_groups


@dataclass
class Motion:
    """How the points have moved since the list was made for its settings (kept across builds)."""

    previous: torch.Tensor  # (n, D) the positions at the previous update (its own memory, rewritten)
    odometer: torch.Tensor  # (n,) float64: the sum of each point's displacements between updates
    # the 90th percentile of the last update's displacements; None before any was measured
    speed: Optional[float] = None


@dataclass
class ListState:
    """A list and its certificates: made by a build, edited by re-anchoring."""

    # what it was made for: a change of any of them (or of the points' shape, dtype or device) builds
    group_size: int
    cutoff: float
    max_skin: float
    # the skin of the last search (a build's, or the last re-anchoring's): its radius = cutoff + skin
    skin: float
    # the largest skin re-anchoring may use: the build's if it shrank its radius (a larger one would
    # outgrow the list), else max_skin
    largest_skin: float
    reference: torch.Tensor  # (n, D) each point's position when its pairs were last searched
    # (n,) a lower bound of the reference distance to every point of another group not listed with it
    clearance: torch.Tensor
    # False: no list was kept (too dense for the points' motion); every update is a dense step
    kept: bool
    pairs: torch.Tensor  # (2, K) the pairs (i < j) within the radius by reference positions
    separation: torch.Tensor  # (K,) lower bounds of their reference distances
    # (K,) float64: the distance at the last evaluation + both odometers then (-inf: not evaluated yet)
    bound: torch.Tensor
    # (n,) bool: points with pairs listed beyond the radius by a re-anchoring (so that their
    # clearance stayed): re-anchored at the next update, which brings their pairs back to the radius
    due: torch.Tensor


@dataclass
class SearchResult:
    """What one search of the reference positions found."""

    # False: its radius shrank below the smallest skin worth keeping (the list is given up)
    kept: bool
    pairs: torch.Tensor  # (2, K) the pairs within the radius (none if not kept)
    separation: torch.Tensor  # (K,) lower bounds of their reference distances
    close: torch.Tensor  # (2, K') the pairs within the cutoff read off the products (builds only)
    # (K'',) the points of ``others`` with pairs listed beyond the radius for their ``needed`` value
    beyond: torch.Tensor


def tolerance(points):
    """Relative rounding margin of norms and distances computed in the points' dtype (a sum of D
    products errs by at most about D eps); the certificates must exceed the cutoff by this much
    (see docs/derivations.md, "The pair search and the neighbour list's certificates", Rounding
    margins)."""
    return max(1e-4, 4 * (points.shape[1] + 2) * torch.finfo(points.dtype).eps)


class NeighborList(PairSearch):
    """A Verlet list of the pairs of points of different groups closer than ``cutoff + skin``,
    with certificates that prove every other pair out of the cutoff while the points move; an
    update costs at most about two or three dense searches, usually a small fraction of one.

    * Each point has a reference position and a clearance (``ListState``); an unlisted pair is
      out of the cutoff while each of its points passes a displacement test against its
      allowance clearance - cutoff (``_beyond_allowance``); points that fail are re-anchored:
      searched again against every point (``_reanchor``).
    * A listed pair is out of the cutoff while its separation or its odometer bound says so
      (``_may_be_close``); only the others are evaluated from their coordinates.
    * A list holds at most ``max_pairs`` = n (n - 1) / 2 / pair_cost pairs (``pair_cost``
      matrix-product entries: the cost of evaluating one pair from its coordinates, None:
      ``default_pair_cost(D)``); a build whose list would hold more shrinks its radius as it
      goes (``_shrink``). An update that would re-anchor more than ``max_reanchored`` of the
      points, or whose list outgrows ``max_pairs``, builds instead.
    * The skin is adaptive (``adaptive_skin``): ``skin`` is the largest; a build starts from the
      skin the points' speed calls for (``choose_skin``), and a list whose skin ends below
      ``smallest_skin`` is not kept: every update is then a dense step (one search at the
      cutoff, whose pair counts by distance say when a list would pay again). Re-anchored
      points are searched with the skin the speed calls for at that update (at most the
      build's, if it shrank), so a list built while the points were slow does not make them
      re-anchor every few updates once they move faster.

    The skin changes only the work, never the result. Every test keeps a margin for rounding,
    so every pair whose distance computed from coordinates is below the cutoff is returned.
    The first call, or any change of the number of points, group size, dtype, device, cutoff
    or largest skin, builds; so does the call after an update that raised (an out-of-memory
    error, say: the state is reset). The list is a cache: displacements are measured against
    the stored references on every call, so in-place changes of the points between calls
    (optimiser steps, ``load_state_dict``) are always noticed; it holds no learnable state.
    """

    # the adaptive skin lets a point at the typical speed go about this many updates
    target_steps = 8
    # a list is kept only if its skin lets a point at the typical speed go this many updates
    min_steps = 2
    # an update that would re-anchor more than this fraction of the points builds instead
    max_reanchored = 0.5
    # resolution of the pair counts by distance in dense steps
    skin_bins = 64

    def __init__(self, chunk_entries=2**22, pair_cost=None, adaptive_skin=True, bfloat16=False):
        super().__init__(chunk_entries)
        self.bfloat16 = bfloat16  # bfloat16 products for the searches of float32 points
        # whether they pay for dense steps (builds and re-anchorings evaluate nothing again: they
        # use them whenever their products are large enough)
        self.dense_choice = Bfloat16Choice()
        self.pair_cost = pair_cost  # None: default_pair_cost(dimension)
        self.adaptive_skin = adaptive_skin
        self.reset()

    @staticmethod
    def default_pair_cost(dim):
        """Gathering two rows and reducing their difference costs about this many
        matrix-product entries (measured on CPU: ~13 at D = 64, ~90 at D = 512, with the
        nonzero() of the blocked search included)."""
        return 8 + dim / 8

    def reset(self):
        """Forget the list: the next update builds."""
        self.state: Optional[ListState] = None
        self.motion: Optional[Motion] = None
        self._buffer: Optional[torch.Tensor] = None
        self._factors = Bfloat16Factors()  # a search's (its points in the search's order)
        # what the searches compute from the reference positions, in list order, kept between
        # updates for the ListState they are of (None: none) and computed again only for the
        # re-anchored points (``_reference_terms``): the positions' norms, and their
        # Bfloat16Factors (every position a column) while bfloat16 products may be used
        self._terms_of: Optional[ListState] = None
        self._reference_norms: Optional[torch.Tensor] = None
        self._reference_factors: Optional[Bfloat16Factors] = None

    def scratch(self, points):
        """An (n, D) tensor like ``points``, kept between updates for the n x D temporaries of an
        update (the displacements, the reordered references of a search; ``kept_buffer``)."""
        self._buffer = kept_buffer(self._buffer, points.shape, points)
        return self._buffer

    def bfloat16_factors(self, points, num_rows, choice=None):
        """The Bfloat16Factors of ``points`` (buffers kept between updates) for the products of a
        search of the first ``num_rows`` of them against all (row_blocks) when they pay
        (``bfloat16_pays``); else None."""
        if not self.bfloat16_pays(points, num_rows, choice):
            return None
        return self._factors.update(points, num_rows, self.gather_entries)

    def bfloat16_pays(self, points, num_rows, choice=None):
        """Whether a search of the first ``num_rows`` of ``points`` against all uses bfloat16
        products: when ``bfloat16`` is set, they are float32 and ``choice`` says they pay
        (Bfloat16Choice; without one, when the products have at least its min_multiply_adds)."""
        if not (self.bfloat16 and points.dtype == torch.float32):
            return False
        multiply_adds = num_rows * points.numel()
        if choice is None:
            return multiply_adds >= Bfloat16Choice.min_multiply_adds
        return choice.use(self.pair_cost_of(points), multiply_adds)

    def pair_cost_of(self, points):
        """``pair_cost`` for these points (the default for their dimension if None)."""
        return self.pair_cost if self.pair_cost is not None else self.default_pair_cost(points.shape[1])

    def last_work(self, points):
        """The last update's work: the entries it searched plus ``pair_cost`` per pair it
        evaluated, as a share of the n (n - 1) / 2 entries of a search of all pairs of the n
        ``points``."""
        n = len(points)
        work = self.stats.last_searched + self.pair_cost_of(points) * self.stats.last_evaluated
        return work / max(n * (n - 1) / 2, 1)

    def max_pairs(self, points):
        """The most pairs a kept list may hold."""
        n = len(points)
        return int(n * (n - 1) / 2 / max(self.pair_cost_of(points), 1.0))

    def choose_skin(self, max_skin):
        """The skin a build starts from: 2 target_steps speed, within [max_skin / 16, max_skin] (see
        docs/derivations.md, "The pair search and the neighbour list's certificates", The
        adaptive skin)."""
        if not self.adaptive_skin or self.motion.speed is None:
            return max_skin
        return min(max_skin, max(max_skin / 16, 2 * self.target_steps * self.motion.speed))

    def smallest_skin(self):
        """The smallest skin worth keeping a list for: a point at the observed speed stays
        within its allowance for ``min_steps`` updates."""
        if not self.adaptive_skin or self.motion.speed is None:
            return 0.0
        return 2 * self.min_steps * self.motion.speed

    def update(self, points, group_size, cutoff, skin, factors=None):
        try:
            # ordinary tensors in the state, also when called under torch.inference_mode(): the
            # state is edited in place by later calls, in or out of inference mode
            with torch.inference_mode(False), torch.no_grad(), full_precision_matmul():
                return self._update(points.detach(), group_size, cutoff, skin, factors)
        except BaseException:
            self.reset()  # a half-made state could miss pairs: the next call builds
            raise

    def wants_factors(self):
        """A dense step comes next (a list was given up), with bfloat16 products allowed."""
        return self.bfloat16 and self.state is not None and not self.state.kept

    def _update(self, points, group_size, cutoff, skin, factors):
        self.stats.start_update()
        if self._stale(points, group_size, cutoff, skin):
            odometer = torch.zeros(len(points), dtype=torch.float64, device=points.device)
            self.motion = Motion(previous=points.clone(), odometer=odometer)
            pairs = self._build(points, group_size, cutoff, skin)
        else:
            displacements = self._measure_motion(points)
            pairs = (
                self._follow(points, displacements) if self.state.kept else self._dense_step(points, factors)
            )
        self.stats.last_returned = pairs.shape[1]
        return pairs

    def _stale(self, points, group_size, cutoff, skin):
        state = self.state
        return (
            state is None
            or state.reference.shape != points.shape
            or state.reference.dtype != points.dtype
            or state.reference.device != points.device
            or (state.group_size, state.cutoff, state.max_skin) != (group_size, cutoff, skin)
        )

    def _measure_motion(self, points):
        """Each point's displacement since the previous update (the 90th percentile of them: the
        speed; every point's odometer moves on by its own) and, with a kept list, since its
        reference position (returned; else None); the previous positions become these. One
        pass over the points in blocks of ``gather_entries`` coordinates: each block's
        differences stay in the CPU's caches (the values of vector_norm(points - previous,
        dim=1), bit for bit: each row is reduced on its own)."""
        motion, state = self.motion, self.state
        n = len(points)
        step = points.new_empty(n)
        displacements = points.new_empty(n) if state.kept else None
        rows = max(1, self.gather_entries // max(points.shape[1], 1))
        scratch = self.scratch(points)
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            block, difference = points[start:stop], scratch[: stop - start]
            torch.sub(block, motion.previous[start:stop], out=difference)
            torch.linalg.vector_norm(difference, dim=1, out=step[start:stop])
            if displacements is not None:
                torch.sub(block, state.reference[start:stop], out=difference)
                torch.linalg.vector_norm(difference, dim=1, out=displacements[start:stop])
            motion.previous[start:stop] = block
        motion.speed = step.kthvalue(max(1, (9 * n + 9) // 10)).values.item()
        motion.odometer += step.double() * (1 + tolerance(points))
        return displacements

    def _build(self, points, group_size, cutoff, max_skin, fitting_skin=math.inf):
        """A search of all pairs, from the current positions; its radius starts at cutoff + the
        skin chosen for the observed speed, at most ``fitting_skin``. Returns the pairs within
        the cutoff."""
        self.state = state = ListState(
            group_size=group_size,
            cutoff=cutoff,
            max_skin=max_skin,
            skin=min(self.choose_skin(max_skin), fitting_skin),
            largest_skin=max_skin,
            reference=points.clone(),
            # before the search: nothing seen, nothing listed
            clearance=torch.full((len(points),), math.inf, dtype=points.dtype, device=points.device),
            kept=True,
            pairs=torch.empty(2, 0, dtype=torch.int64, device=points.device),
            separation=points.new_empty(0),
            bound=torch.empty(0, dtype=torch.float64, device=points.device),
            due=torch.zeros(len(points), dtype=torch.bool, device=points.device),
        )
        everyone = torch.arange(len(points), device=points.device)
        skin = state.skin
        found = self._search(everyone, everyone.new_empty(0), build=True)
        if state.skin < skin:  # shrunk: re-anchoring with a larger skin would outgrow the list
            state.largest_skin = state.skin
        state.kept, state.pairs, state.separation = found.kept, found.pairs, found.separation
        state.bound = torch.full_like(found.separation, -math.inf, dtype=torch.float64)  # not evaluated yet
        self.stats.num_builds += 1
        self.stats.num_dense_builds += int(not found.kept)
        self.stats.last_reanchored = len(points)
        return self.within_cutoff(points, found.close, cutoff)

    def _follow(self, points, displacements):
        """An update of a kept list, given each point's ``displacements`` from its reference
        position: re-anchor the points that fail their displacement test, and those due
        (``ListState.due``), until all pass (one search, as a rule: ``_reanchor``), then the
        listed pairs that may be within the cutoff."""
        state = self.state
        due, needed = state.due, self._needed_allowance(displacements)
        while True:
            moved = self._beyond_allowance(displacements, state.clearance, needed) | due
            count = int(moved.sum())
            if not count:
                return self._may_be_close(points, displacements)
            if self.stats.last_reanchored + count > self.max_reanchored * len(points):
                return self._build(points, state.group_size, state.cutoff, state.max_skin)
            displacements = displacements.masked_fill(moved, 0.0)
            needed = self._needed_allowance(displacements)
            self._reanchor(points, moved, needed)
            due = torch.zeros_like(due)  # (those of this search: at the next update)
            if state.pairs.shape[1] > self.max_pairs(points):
                return self._build(points, state.group_size, state.cutoff, state.max_skin)

    def _beyond_allowance(self, displacements, clearance, needed=None):
        """The points to re-anchor, given their ``clearance`` r (the state's, or lower bounds of
        it): an unlisted pair (i, j) is now at least max(r_i, r_j) - disp_i - disp_j apart, so it
        is out of the cutoff if either point passes one of two tests with its
        allowance a_i = r_i - cutoff: disp_i <= a_i / 2 (shared with every other point), or
        disp_i + the largest displacement of any other point <= a_i (a point may use its whole
        allowance while the others stay still). Points that pass neither are re-anchored.
        ``tolerance`` covers the rounding of the displacements and of the distances computed
        from coordinates. See docs/derivations.md, "The pair search and the neighbour list's
        certificates", The list, the clearances and the displacement test. ``needed``:
        ``_needed_allowance(displacements)``, if the caller has it."""
        if needed is None:
            needed = self._needed_allowance(displacements)
        allowance = clearance - self.state.cutoff * (1 + tolerance(self.state.reference))
        return allowance < needed

    def _needed_allowance(self, displacements):
        """The smallest allowance with which each point passes a test of ``_beyond_allowance``
        at these displacements: min(2 disp_i, disp_i + the largest other displacement), with
        the margin for rounding (x > a / 2 is 2 x > a exactly: the same tests)."""
        displacements = displacements * (1 + tolerance(self.state.reference))
        top = displacements.topk(min(2, len(displacements))).values
        # (tensor operations throughout: no value read on the host)
        largest_other = top[0]
        if len(top) > 1:
            largest = torch.arange(len(displacements), device=displacements.device) == displacements.argmax()
            largest_other = torch.where(largest, top[1], top[0])
        return torch.minimum(2 * displacements, displacements + largest_other)

    def _may_be_close(self, points, displacements):
        """The listed pairs within the cutoff. A pair whose reference distance is >= separation is now >=
        separation - disp_i - disp_j apart, and one that was >= d apart at its last evaluation
        is now >= d - (the path lengths both points moved since) = bound - odometer_i -
        odometer_j (triangle inequality): a pair for which either is >= the cutoff adds an exact
        zero. The others are evaluated from their coordinates (in blocks), which renews their
        bound, and returned if within the cutoff. See docs/derivations.md, "The pair search and
        the neighbour list's certificates", Listed pairs: separations and odometers."""
        state, odometer = self.state, self.motion.odometer
        margin = tolerance(points)
        reach = state.cutoff * (1 + margin)
        first, second = state.pairs
        moved = (displacements[first] + displacements[second]) * (1 + margin)
        odometers = odometer[first] + odometer[second]
        unsure = (state.separation - moved < reach) & (state.bound - odometers < reach)
        candidates = unsure.nonzero().squeeze(1)
        self.stats.last_evaluated = len(candidates)
        if not len(candidates):
            return state.pairs.new_empty(2, 0)
        sq = pair_sq_distances_in_blocks(points, state.pairs[:, candidates], self.gather_entries)
        renewed = sq.double().sqrt() * (1 - margin) + odometers[candidates]
        state.bound[candidates] = renewed
        return state.pairs[:, candidates[sq < state.cutoff**2 + squared_distance_slack(points)]]

    def _reanchor(self, points, moved, needed):
        """The ``moved`` points get their current position as reference and are searched again
        against every point, within the radius cutoff + the skin the current speed calls for
        (``choose_skin``, at most ``largest_skin``; any radius keeps the list exact): their
        pairs are replaced, and every clearance is lowered to the distances seen. A pair beyond
        the radius that would lower the clearance of a point not searched below what that point
        needs to pass its test (the cutoff + its ``needed`` allowance: ``_needed_allowance`` of
        the displacements after the update, the moved points' zero) is listed instead, so that
        no point fails after the search, and that point is due (re-anchored at the next update;
        see docs/derivations.md, "The pair search and the neighbour list's certificates", The
        list, the clearances and the displacement test)."""
        state = self.state
        state.skin = self._reanchoring_skin()
        anchored = moved.nonzero().squeeze(1)
        others = (~moved).nonzero().squeeze(1)
        state.reference.index_copy_(0, anchored, points.index_select(0, anchored))
        state.clearance.index_fill_(0, anchored, math.inf)  # (a Python value set by index: a GPU waits)
        # the listed pairs of two unmoved points (one index for the three tensors of the list)
        unmoved = (~(moved[state.pairs[0]] | moved[state.pairs[1]])).nonzero().squeeze(1)
        # (a hair above: the clearances the search computes in the points' precision may round
        # a few units of the last place below the distances)
        needed = (needed + state.cutoff * (1 + tolerance(points))) * (1 + 2.0**-20)
        found = self._search(anchored, others, build=False, needed=needed[others])
        state.due = torch.zeros_like(moved).index_fill_(0, found.beyond, True)
        state.pairs = torch.cat([state.pairs.index_select(1, unmoved), found.pairs], dim=1)
        state.separation = torch.cat([state.separation.index_select(0, unmoved), found.separation])
        unevaluated = torch.full_like(found.separation, -math.inf, dtype=torch.float64)
        state.bound = torch.cat([state.bound.index_select(0, unmoved), unevaluated])
        self.stats.num_partial_rebuilds += 1
        self.stats.num_reanchored += len(anchored)
        self.stats.last_reanchored += len(anchored)

    def _reanchoring_skin(self):
        """The skin of a re-anchoring's search: the one the current speed calls for, at most
        ``largest_skin``."""
        return min(self.choose_skin(self.state.max_skin), self.state.largest_skin)

    def _dense_step(self, points, factors=None):
        """The pairs within the cutoff of the current positions, by one blocked search; builds (and keeps
        the list) instead once the largest skin whose pairs fit in a kept list is at least
        ``smallest_skin``: the search counts the pairs within the first radius that reaches it,
        and only if they fit does a second search count the pairs by distance, between the
        cutoff and the largest radius, in ``skin_bins`` bins, for the build's skin. See
        docs/derivations.md, "The pair search and the neighbour list's certificates", Dense
        steps and their histogram."""
        state = self.state
        # radii from the cutoff to the largest radius in skin_bins equal steps
        steps = torch.arange(self.skin_bins + 1, dtype=torch.float64)
        radii = state.cutoff + state.max_skin * steps / self.skin_bins
        chosen, smallest = self.choose_skin(state.max_skin), self.smallest_skin()
        max_pairs = self.max_pairs(points)
        # the first bin whose skin reaches smallest_skin: a skin of at least smallest_skin fits
        # (and the step builds) if and only if the pairs up to that bin fit in max_pairs
        reaching = ((radii[1:] - state.cutoff) >= smallest).nonzero()
        within_bin = reaching[0].item() if chosen >= smallest and len(reaching) else None
        choice = self.dense_choice
        if factors is None:  # (else the caller's, of these points: wants_factors)
            factors = self.bfloat16_factors(points, len(points), choice)
        # (no skin can be kept: the sweep at the cutoff alone, with no counts)
        swept = radii if within_bin is not None else radii[:1]
        sweep = dense_sweep(
            points, state.group_size, state.cutoff, swept, self.chunk_entries, factors, within_bin, max_pairs
        )
        self.stats.last_searched += sweep.searched
        self.stats.num_dense_steps += 1
        if within_bin is not None and sweep.within <= max_pairs:
            counted = dense_sweep(points, state.group_size, state.cutoff, radii, self.chunk_entries, factors)
            self.stats.last_searched += counted.searched
            fits = torch.cumsum(counted.counts, 0) <= max_pairs
            largest = radii[1:][fits.cpu()].max().item() - state.cutoff
            # from a skin whose pairs fit: the build need not shrink below smallest_skin
            return self._build(points, state.group_size, state.cutoff, state.max_skin, largest)
        pairs = self.within_cutoff(points, sweep.pairs, state.cutoff)
        if factors is not None:
            # the pairs read off only because of the bounds' width (with a float32 search's margin)
            choice.observe(sweep.pairs.shape[1] - pairs.shape[1], sweep.searched)
        return pairs

    def _search(self, rows, others, build, needed=None):
        """The pairs within the radius (by reference positions) with at least one point in
        ``rows``: each row against the later rows and all ``others`` (together: every point).
        Lowers the clearances of all points to the distances seen; with ``needed`` (one value per
        point of ``others``), the pairs that would lower the clearance of one of ``others`` below
        its ``needed`` value are listed too (any pairs may be listed: the list stays exact), and
        those points returned as ``beyond``. A build (``build``) also reads off the pairs within
        the cutoff, and shrinks a radius that would hold more than ``max_pairs`` pairs on the
        way (``_shrink``), giving the list up if its skin falls below ``smallest_skin`` (or 1e-6
        of the cutoff)."""
        state = self.state
        order = torch.cat([rows, others])
        norms, kept_factors = self._reference_terms(rows)
        reference = state.reference
        # (squared_distance_slack of the reference positions, from their kept norms)
        largest = norms.max().item() if len(norms) else 0.0
        slack = rounding_slack(largest, reference.shape[1], reference.dtype)
        threshold = (state.cutoff + state.skin) ** 2 + slack
        ref = factors = None  # the reference positions in the search's order, or their factors
        if kept_factors is not None and self.bfloat16_pays(reference, len(rows)):
            factors = self._factors.gathered(kept_factors, order, len(rows))
        else:
            ref = torch.index_select(reference, 0, order, out=self.scratch(reference))
        close_threshold = state.cutoff**2 + slack
        max_pairs = self.max_pairs(reference)
        members = group_members(order, state.group_size)
        nearest = torch.full((len(order),), math.inf, dtype=reference.dtype, device=reference.device)
        raised = None  # how far above the threshold each column's pairs are listed
        if needed is not None:
            raised = torch.zeros(len(order), dtype=reference.dtype, device=reference.device)
            raised[len(rows) :] = (needed.square() + slack - threshold).clamp(min=0)
        kept, found, found_sq, close, beyond = True, [], [], [], []
        for start, sq, width in row_blocks(ref, len(rows), self.chunk_entries, factors, threshold):
            stop = start + len(sq)
            mask_own_groups(sq, start, members)
            # with bfloat16 products (width > 0) the entries are lower bounds: the pairs listed are
            # a superset and their separations lower bounds, which is all the list needs
            row, col = entries_below(sq if raised is None else sq - raised[start:], threshold)
            self.stats.last_searched += sq.numel()
            # the pairs (a row with a later point), selected once (each boolean mask a GPU waits for)
            listed = torch.stack([row, col])[:, col > row]
            listed_sq = sq[listed[0], listed[1]]
            if kept:
                found.append(listed + start)
                found_sq.append(listed_sq)
                if raised is not None:
                    beyond.append(listed[1, listed_sq >= threshold] + start)
            if build:
                close.append(listed[:, listed_sq < close_threshold] + start)
            # clearances: the nearest point of another group that is not listed
            sq.index_put_((row, col), sq.new_full((), math.inf))
            nearest[start:stop] = torch.minimum(nearest[start:stop], sq.amin(dim=1))
            nearest[start:] = torch.minimum(nearest[start:], sq.amin(dim=0))
            if build and kept and sum(map(len, found_sq)) > max_pairs:
                kept, found, found_sq, threshold = self._shrink(
                    found, found_sq, nearest, max_pairs // 2, slack
                )
            if not kept:
                # no list: only the pairs within the cutoff are extracted from now on
                threshold = close_threshold
        lower_bound = (nearest - slack).clamp(min=0).sqrt()
        state.clearance[order] = torch.minimum(state.clearance[order], lower_bound)
        separation = (torch.cat(found_sq) - slack).clamp(min=0).sqrt() if found_sq else reference.new_empty(0)
        beyond = order[torch.cat(beyond)] if beyond else order.new_empty(0)
        return SearchResult(kept, _ordered(order, found), separation, _ordered(order, close), beyond)

    def _reference_terms(self, changed):
        """The norms of the reference positions and, while bfloat16 products may be used (float32
        points, ``bfloat16``), their Bfloat16Factors (None otherwise), both in list order, after
        the reference positions of the points ``changed`` changed (a re-anchoring's; a build's:
        a new state, all of them): computed again for those alone, or for all the first time
        for a state. Each point's values depend on its own position only, the same as those
        of all positions at once, bit for bit."""
        state, reference = self.state, self.state.reference
        with_factors = self.bfloat16 and reference.dtype == torch.float32
        fresh = self._terms_of is not state
        changed_positions = None if fresh else reference.index_select(0, changed)
        if fresh:
            self._terms_of = state
            self._reference_norms = torch.linalg.vector_norm(reference, dim=1)
        else:
            changed_norms = torch.linalg.vector_norm(changed_positions, dim=1)
            self._reference_norms.index_copy_(0, changed, changed_norms)
        factors = self._reference_factors
        if not with_factors:
            factors = None
        elif fresh or factors is None:  # (a kept object's buffers are used again)
            factors = (factors or Bfloat16Factors()).update(reference, 0, self.gather_entries)
        else:
            factors.update_rows(changed, changed_positions, self.gather_entries)
        self._reference_factors = factors
        return self._reference_norms, self._reference_factors

    def _shrink(self, found, found_sq, nearest, keep, slack):
        """The pairs found so far, cut to the ``keep`` closest ones: the radius (and the state's skin)
        shrink to the distance of the first dropped pair, and the dropped pairs' points lower
        their ``nearest`` (unlisted) distances. Returns whether the list is kept (not if the
        skin fell below ``smallest_skin`` or 1e-6 of the cutoff), the kept pairs and squared
        distances, and the new squared threshold. See docs/derivations.md, "The pair search and
        the neighbour list's certificates", How big a list may be, and the shrinking radius."""
        state = self.state
        pairs, sq = torch.cat(found, dim=1), torch.cat(found_sq)
        threshold = sq.kthvalue(keep + 1).values.item() if keep < len(sq) else sq.max().item()
        dropped = sq >= threshold
        for ends in pairs[:, dropped]:
            nearest.scatter_reduce_(0, ends, sq[dropped], "amin")
        state.skin = max(threshold - slack, 0.0) ** 0.5 - state.cutoff
        if state.skin < max(self.smallest_skin(), 1e-6 * state.cutoff):
            return False, [], [], threshold
        return True, [pairs[:, ~dropped]], [sq[~dropped]], threshold


def _ordered(order, found):
    """Local pair positions (a list of (2, K) blocks) -> (2, K) point indices with i < j."""
    pairs = order[torch.cat(found, dim=1)] if found else order.new_empty(2, 0)
    return torch.stack([pairs.min(dim=0).values, pairs.max(dim=0).values])
