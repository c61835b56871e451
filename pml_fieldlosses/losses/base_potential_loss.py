import torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.losses import BaseMetricLossFunction, WeightRegularizerMixin
from pytorch_metric_learning.reducers import SumReducer
from pytorch_metric_learning.utils import common_functions as c_f

from ..utils import checks
from ..utils.loss_utils import GatheredNormalizedRows, NormalizedRows, unit_rows
from .mixins import CheckedForwardMixin
from .potential.candidates import canonical_order, class_pairs, embedding_candidates
from .potential.distances import (
    Bfloat16Choice,
    Bfloat16Factors,
    DifferencesBuffer,
    bfloat16_products_pay,
    full_precision_matmul,
    kept_buffer,
)
from .potential.energy import (
    PairPotential,
    dense_energies,
    off_plateau_pair_counts,
    pair_potential_matrix,
    scalable_energies,
)
from .potential.neighbor_list import NeighborList
from .potential.pair_search import ListChoice


# Shared part of the losses of "Potential Field Based Deep Metric Learning"
# (Bhatnagar & Ahuja, CVPR 2025), Eq. 1-6; no official code exists.
class BasePotentialLoss(CheckedForwardMixin, WeightRegularizerMixin, BaseMetricLossFunction):
    """Energy of the batch embeddings and all learnable proxies in a potential field.

    The P = B + N M points q_a are the normalised embeddings, then the proxies (normalised
    if ``normalize_proxies``, class-major), with their labels l_a. The paper's energy
    (Eq. 3-6) is a sum over the ordered pairs of points,

        U = sum_a sum_b phi(d_ab, l_a = l_b),
        phi(d, same) = attraction(d) (Eq. 1), phi(d, different) = repulsion(d) (Eq. 2),

    d the Euclidean distance. Its P self terms are a constant (no gradient) and are left out:
    the loss returns E_a = sum_{b != a} phi(d_ab, l_a = l_b) as two element losses,
    "embedding_loss" (the B embeddings) and "proxy_loss" (the proxies); the default
    SumReducer adds them up to U minus its constant self terms (see docs/derivations.md,
    "The potential energy and its plateau decomposition").

    Two paths give the same E_a (potential/energy.py):
      * the dense path, the sum as written over all P x P pairs: O(P^2 D) time and memory;
        used for small point sets (P^2 D <= ``dense_entries``) or when ``dense=True``;
      * the scalable path, the plateau decomposition: attraction is constant within delta
        and repulsion beyond repulsion_delta, so the sum is plateau counts plus the pairs
        off their plateau, found by searches without gradient (potential/candidates.py):
        beyond a few points, the embeddings' pairs by one product of the embeddings with
        all points, and those of proxies of different classes by ``neighbor_list``, a Verlet
        list (potential/neighbor_list.py; any potential.pair_search.PairSearch will do); for
        up to about 1 450 points (P^2 <= ``all_pairs_entries``) on a CPU the same while the
        list costs little, else one product of all points with all points
        (``list_for_few_points``).
    Subclasses give ``attraction(sq)`` and ``repulsion(sq)`` as functions of sq = d^2
    (constant on the plateaus).
    """

    # entries of one block of a distance computation (bounds the memory)
    chunk_entries = 2**22
    # gathered coordinates per block when pairs are filtered by their distances, and per
    # block of the energies' coordinate differences, on a CPU (small blocks stay in its caches;
    # large fresh buffers cost page faults; smaller ones cost more operations: 2^18 took
    # 2-3 % less per step than 2^17 at N = 400, see docs/performance-log.md); see
    # gather_block_entries for other devices
    gather_entries = 2**18
    # dense=None uses the dense path while P * P * D is at most this
    dense_entries = 2**20
    # the P = B + N M points are few while P * P is at most this (at B = 256, D = 512 up to
    # about 600 classes of 2 proxies): the scalable path may then search all their pairs in one
    # product (no neighbour list) instead, which took 0.73-0.99x the list's step there
    # (docs/performance-log.md), as list_for_few_points says
    all_pairs_entries = 2**21
    # for few points: None follows the neighbour list while its own work stays low and searches
    # all pairs otherwise, on a CPU (potential.pair_search.ListChoice; on a GPU, bound by kernel
    # launches, all pairs); True the list always, False all pairs always
    list_for_few_points = None
    # skin of the proxy neighbour list, in units of repulsion_delta
    neighbor_skin = 1.0
    # the searches' matrix products in bfloat16 for float32 points on a CPU, with their margin, the
    # undecided pairs evaluated again in float32 (the same pairs, and the same loss bit for bit):
    # None where they are at least twice as fast (bfloat16_products_pay), True always, False never
    # (docs/derivations.md, "bfloat16 products, with their own margin")
    bfloat16_search = None

    def __init__(
        self,
        num_classes,
        embedding_size,
        proxies_per_class,
        delta,
        repulsion_delta=None,
        normalize_proxies=True,
        dense=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        c_f.assert_distance_type(self, LpDistance, p=2, power=1)
        checks.check_positive_int("num_classes", num_classes)
        checks.check_positive_int("embedding_size", embedding_size)
        checks.check_positive_int("proxies_per_class", proxies_per_class)
        checks.check_positive("delta", delta)
        if repulsion_delta is None:
            repulsion_delta = delta
        checks.check_positive("repulsion_delta", repulsion_delta)
        if dense is not None and not isinstance(dense, bool):
            raise ValueError(f"dense must be None (automatic), True or False, got {dense!r}")
        # the squared radii are thresholds, and CPML's potentials reach them
        checks.check_fits_float32(f"delta**2 (delta={delta})", lambda: float(delta) ** 2)
        checks.check_fits_float32(
            f"repulsion_delta**2 (repulsion_delta={repulsion_delta})", lambda: float(repulsion_delta) ** 2
        )
        self.num_classes = num_classes
        self.embedding_size = embedding_size
        self.proxies_per_class = proxies_per_class
        self.delta = delta
        self.repulsion_delta = repulsion_delta
        self.normalize_proxies = normalize_proxies
        self.dense = dense
        self.proxies = torch.nn.Parameter(torch.Tensor(num_classes, proxies_per_class, embedding_size))
        self.weight_init_func(self.proxies)
        # the search for the proxy pairs of different classes (a cache, not learnable state)
        self.neighbor_list = NeighborList(self.chunk_entries)
        self._search_points = None  # the searches' points (search_points; a cache)
        self._bfloat16_factors = Bfloat16Factors()  # the same in bfloat16 (candidate_pairs; a cache)
        self._bfloat16_choice = Bfloat16Choice()  # whether the embeddings' products are bfloat16
        self._list_choice = ListChoice()  # for few points: the list or one search of all pairs
        self._differences = DifferencesBuffer()  # the pairs' coordinate differences (a cache)
        self.add_to_recordable_attributes(
            list_of_names=[
                "num_classes",
                "embedding_size",
                "proxies_per_class",
                "delta",
                "repulsion_delta",
            ],
            is_stat=False,
        )
        self.add_to_recordable_attributes(
            list_of_names=[
                "num_attraction_pairs",
                "num_repulsion_pairs",
                "num_reanchored_proxies",
                "num_searched_proxy_pairs",
                "num_evaluated_proxy_pairs",
            ],
            is_stat=True,
        )

    def attraction(self, sq):
        raise NotImplementedError

    def repulsion(self, sq):
        raise NotImplementedError

    def pair_potential(self):
        return PairPotential(self.attraction, self.repulsion, self.delta, self.repulsion_delta)

    def cast_types(self, dtype, device):
        # never below float32: half-precision inputs were upcast by CheckedForwardMixin; outside
        # inference mode, so that a cast under torch.inference_mode() leaves an ordinary parameter
        with torch.inference_mode(False):
            self.proxies.data = c_f.to_device(self.proxies.data, device=device, dtype=dtype)

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        c_f.indices_tuple_not_supported(indices_tuple)
        checks.ref_not_supported(self, embeddings, labels, ref_emb, ref_labels)
        self.cast_types(embeddings.dtype, embeddings.device)
        B = len(embeddings)
        if self.distance.normalize_embeddings:
            embeddings = self.normalized(embeddings)
        # PML's regularizers take one row per vector: (num_classes * proxies_per_class, D)
        raw_proxies = self.proxies.reshape(-1, self.embedding_size)
        # (a NaN proxy would make the dense energies NaN, and drop out of the searches' pairs)
        checks.check_finite(raw_proxies, f"{type(self).__name__}.proxies")
        point_labels = torch.cat([labels, self.proxy_labels(labels.device)])
        if self.use_dense(len(point_labels)):
            energies = self.dense_energies(
                torch.cat([embeddings, self.proxy_points(raw_proxies)]), point_labels
            )
        else:
            energies = self.sparse_energies(embeddings, raw_proxies, point_labels)
        loss_dict = {
            "embedding_loss": {
                "losses": energies[:B],
                "indices": c_f.torch_arange_from_size(embeddings),
                "reduction_type": "element",
            },
            "proxy_loss": {
                "losses": energies[B:],
                "indices": c_f.torch_arange_from_size(raw_proxies),
                "reduction_type": "element",
            },
        }
        self.add_weight_regularization_to_loss_dict(loss_dict, raw_proxies)
        return loss_dict

    def proxy_points(self, raw_proxies):
        """The proxies as points of the field: rows of ``raw_proxies``,
        normalised if ``normalize_proxies``."""
        return self.normalized(raw_proxies) if self.normalize_proxies else raw_proxies

    def normalized(self, rows):
        """self.distance.normalize(rows): the same values and gradients. On CPU, where the
        passes over the proxies weigh in a step, in fewer passes (NormalizedRows, bit for bit
        torch's normalize) when the distance normalises as PML's does (p = 2); on a GPU the
        step is bound by kernel launches, which autograd's chain issues with less Python
        overhead."""
        if not self.normalizes_in_fewer_passes(rows):
            return self.distance.normalize(rows)
        return NormalizedRows.apply(rows, 1e-12, False)  # torch's normalize's eps

    def normalizes_in_fewer_passes(self, rows):
        """Whether ``normalized`` takes NormalizedRows for ``rows`` (see there)."""
        distance = self.distance
        return (
            rows.device.type == "cpu" and type(distance).normalize is LpDistance.normalize and distance.p == 2
        )

    def proxy_labels(self, device):
        classes = torch.arange(self.num_classes, device=device)
        return classes.repeat_interleave(self.proxies_per_class)

    def use_dense(self, num_points):
        if self.dense is None:
            return num_points**2 * self.embedding_size <= self.dense_entries
        return self.dense

    def dense_energies(self, points, point_labels):
        """E_a over all P x P pairs: the paper's sum as written (no plateaus, no search)."""
        potential = self.pair_potential()
        phi, same = pair_potential_matrix(points, point_labels, potential)
        if self.collect_stats:
            with torch.no_grad():
                self.record_dense_stats(phi, same, potential)
        return dense_energies(phi)

    def sparse_energies(self, embeddings, raw_proxies, point_labels):
        """The same E_a by the plateau decomposition: the searches without gradient, then the
        energy of the pairs they found."""
        B = len(embeddings)
        with torch.no_grad(), full_precision_matmul():  # the searches' rounding margins assume it
            points, norms = self.search_points(embeddings.detach(), raw_proxies.detach())
            pairs, same = self.candidate_pairs(points, B, point_labels)
        gather_entries = self.gather_block_entries(points.device)
        if norms is None:

            def points_with(rows):
                return torch.cat(
                    [embeddings, self.proxy_points(torch.nn.functional.embedding(rows, raw_proxies))]
                )

        else:  # the searches' normalised proxies and their norms, with NormalizedRows' gradient

            def points_with(rows):
                block_rows = gather_entries // points.shape[1]
                return GatheredNormalizedRows.apply(
                    embeddings, raw_proxies, rows, points[B:], norms, 1e-12, block_rows
                )

        # the most differences one block can hold: chunk_entries coordinates, or all pairs' if fewer
        P, D = len(point_labels), points.shape[1]
        self._differences.entries = min(self.chunk_entries, P * (P - 1) // 2 * D)
        energies = scalable_energies(
            embeddings,
            len(raw_proxies),
            point_labels,
            potential=self.pair_potential(),
            pairs=pairs,
            same=same,
            points_with=points_with,
            proxies_per_class=self.proxies_per_class,
            chunk_entries=self.chunk_entries,
            gather_entries=gather_entries,
            differences=self._differences,
        )
        if self.collect_stats:
            self.record_sparse_stats(same)
        return energies

    def gather_block_entries(self, device):
        """Gathered coordinates per block on ``device``: ``gather_entries`` on a CPU; elsewhere
        (a GPU) at least ``chunk_entries``, the bound of the other blocks' memory. On a GPU a
        block costs a few kernel launches whatever its size, and its allocator reuses memory
        without page faults: blocks of 2^17 coordinates (the CPU's then) made a step at 11 318
        classes (B = 180, D = 512) launch about 2 400 operations instead of about 560. The
        values are the same for any block size (each pair and each point is computed as in one
        block)."""
        if device.type == "cpu":
            return self.gather_entries
        return max(self.gather_entries, self.chunk_entries)

    def search_points(self, embeddings, raw_proxies):
        """The points the searches see: the B embeddings, then the proxies as points
        (``proxy_points``), in one (B + N M, D) tensor kept between steps and written in place
        (``kept_buffer``: at tens of thousands of proxies a fresh one would cost more in page
        faults than the searches' arithmetic). A cache, not state: not saved, and made again
        for another shape, dtype or device. Rewritten at every call, so a view of it is not to
        be kept. Also returns the proxies' norms (N M, 1) where ``normalized`` takes
        NormalizedRows (its values, bit for bit), for the energies to take the normalised
        proxies from here (GatheredNormalizedRows), else None."""
        B = len(embeddings)
        norms = None
        # an ordinary tensor also under torch.inference_mode(): later calls write it in place
        with torch.inference_mode(False):
            shape = (B + len(raw_proxies), raw_proxies.shape[1])
            points = self._search_points = kept_buffer(self._search_points, shape, embeddings)
            points[:B] = embeddings
            if self.normalize_proxies and self.normalizes_in_fewer_passes(raw_proxies):
                _, norms = unit_rows(raw_proxies, 1e-12, out=points[B:])
            elif self.normalize_proxies and type(self.distance).normalize is LpDistance.normalize:
                # what proxy_points computes (PML's LpDistance.normalize), written into the cache
                torch.nn.functional.normalize(raw_proxies, p=self.distance.p, dim=1, out=points[B:])
            else:
                points[B:] = self.proxy_points(raw_proxies)
        return points, norms

    def candidate_pairs(self, points, num_embeddings, point_labels):
        """Unordered pairs (i < j) of ``points`` (the ``num_embeddings`` embeddings, then the
        proxies) that may be off their plateau, in a canonical order: a (2, K) index tensor and
        a bool mask of the same-class pairs: the embeddings' pairs, the pairs of proxies of one
        class and those of different classes (``neighbor_list``) apart, or for few points
        (``searches_all_pairs``) one search of all pairs (``list_for_few_points``)."""
        B = num_embeddings
        search = self.neighbor_list
        # few points: all their pairs in one product, or the list as for more points, as
        # list_for_few_points says (None: ListChoice's choice on a CPU, all pairs elsewhere)
        few_points = self.searches_all_pairs(len(points))
        choosing = (
            few_points
            and self.list_for_few_points is None
            and points.device.type == "cpu"
            and isinstance(search, NeighborList)
        )
        if choosing:
            all_pairs = not self._list_choice.use_list()
        else:
            all_pairs = few_points and not self.list_for_few_points
        num_rows = len(points) if all_pairs else B
        proxies = points[B:]
        gather_entries = self.gather_block_entries(points.device)
        search.bfloat16 = self.use_bfloat16_search(points)
        factors = proxy_factors = None
        pair_cost = NeighborList.default_pair_cost(points.shape[1])
        if search.bfloat16 and self._bfloat16_choice.use(pair_cost, num_rows * points.numel()):
            # every point a row too when the search's next update would take the proxies' factors
            factor_rows = len(points) if all_pairs or search.wants_factors() else B
            # kept like search_points (ordinary tensors also under torch.inference_mode())
            with torch.inference_mode(False):
                factors = self._bfloat16_factors.update(points, factor_rows, gather_entries)
            if factor_rows == len(points) and not all_pairs:
                proxy_factors = factors.tail(B)
        pairs, undecided = embedding_candidates(
            points,
            B,
            point_labels,
            self.proxies_per_class,
            self.delta,
            self.repulsion_delta,
            self.chunk_entries,
            factors,
            gather_entries,
            num_rows,
        )
        if factors is not None:
            self._bfloat16_choice.observe(undecided, num_rows * len(points))
        if all_pairs:
            if getattr(search, "state", None) is not None:
                search.reset()  # (not followed meanwhile: it builds when next used)
            search.stats.start_update()
            n = len(proxies)
            search.stats.last_searched, search.stats.last_evaluated = n * (n - 1) // 2, undecided
            if choosing:
                self._list_choice.observe()
            return canonical_order(torch.cat(pairs, dim=1), point_labels)
        # proxies of one class that may be farther apart than delta
        pairs.append(class_pairs(proxies, self.proxies_per_class, self.delta, gather_entries) + B)
        # proxies of different classes within repulsion_delta (by their coordinates)
        search.chunk_entries, search.gather_entries = self.chunk_entries, gather_entries
        skin = self.neighbor_skin * self.repulsion_delta
        pairs.append(
            search.update(proxies, self.proxies_per_class, self.repulsion_delta, skin, proxy_factors) + B
        )
        if choosing:  # (the bfloat16 products of the embeddings': the search of all pairs would take them)
            self._list_choice.observe(search.last_work(proxies), bfloat16=factors is not None)
        return canonical_order(torch.cat(pairs, dim=1), point_labels)

    def searches_all_pairs(self, num_points):
        """Whether ``num_points`` points are few enough for ``candidate_pairs`` to search all
        their pairs in one product: while their number squared is at most ``all_pairs_entries``
        (whether it does: ``list_for_few_points``)."""
        return num_points**2 <= self.all_pairs_entries

    def use_bfloat16_search(self, points):
        """Whether the searches multiply in bfloat16 (``bfloat16_search``), for these points: float32
        on a CPU only (their margin assumes float32 sums, which CUDA's bfloat16 products need not
        keep: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)."""
        if points.dtype != torch.float32 or points.device.type != "cpu":
            return False
        if self.bfloat16_search is None:
            return bfloat16_products_pay()
        return self.bfloat16_search

    def record_dense_stats(self, phi, same, potential):
        self.num_attraction_pairs, self.num_repulsion_pairs = off_plateau_pair_counts(phi, same, potential)
        n, M = self.num_classes * self.proxies_per_class, self.proxies_per_class
        self.num_reanchored_proxies = self.num_searched_proxy_pairs = 0
        self.num_evaluated_proxy_pairs = n * (n - 1) // 2 - self.num_classes * M * (M - 1) // 2

    def record_sparse_stats(self, same):
        self.num_attraction_pairs = int(same.sum())
        self.num_repulsion_pairs = int((~same).sum())
        stats = self.neighbor_list.stats
        self.num_reanchored_proxies = stats.last_reanchored
        self.num_searched_proxy_pairs = stats.last_searched
        self.num_evaluated_proxy_pairs = stats.last_evaluated

    def get_default_reducer(self):
        return SumReducer()

    def get_default_distance(self):
        return LpDistance(p=2, power=1, normalize_embeddings=True)

    def _sub_loss_names(self):
        return ["embedding_loss", "proxy_loss"]
