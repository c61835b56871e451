import torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.losses import BaseMetricLossFunction, WeightRegularizerMixin
from pytorch_metric_learning.reducers import SumReducer
from pytorch_metric_learning.utils import common_functions as c_f
from torch.utils.checkpoint import checkpoint

from ..utils import checks
from ..utils.neighbor_list import NeighborList, full_precision_matmul, pair_sq_distances, rounding_slack
from .mixins import CheckedForwardMixin


# Shared part of the losses of "Potential Field Based Deep Metric Learning"
# (Bhatnagar & Ahuja, CVPR 2025), Eq. 1-6; no official code exists.
class BasePotentialLoss(CheckedForwardMixin, WeightRegularizerMixin, BaseMetricLossFunction):
    """Energy of the batch embeddings and all learnable proxies in a potential field.

    The spec's sum (LOSSES.md 6.3). The class field of class j at r is

        Psi_j(r) = sum_{i: y_i = j} psi_att(d(r, z_i)) + sum_k psi_att(d(r, p_jk))
                 + sum_{i: y_i != j} psi_rep(d(r, z_i)) + sum_{g != j} sum_k psi_rep(d(r, p_gk))

    and U = sum_i Psi_{y_i}(z_i) + sum_{j,k} Psi_j(p_jk). Stacking the
    P = B + N M points q_a (the normalised embeddings, then the proxies,
    normalised if ``normalize_proxies``, class-major) with their labels l_a,
    every term of U is one ordered pair (a, b):

        U = sum_a sum_b phi(d_ab, l_a = l_b),
        phi(d, same) = psi_att(d) (``attraction``), phi(d, different) = psi_rep(d) (``repulsion``),

    d the Euclidean distance. The P self terms b = a are the constant
    psi_att(0) (no gradient) and are left out: the loss returns

        E_a = sum_{b != a} phi(d_ab, l_a = l_b)

    as two element losses, "embedding_loss" (the B embeddings) and
    "proxy_loss" (the proxies); the default SumReducer adds them up to U
    minus its constant self terms.

    The dense path (``dense_energies``) is this sum as written: the P x P
    squared distances from coordinate differences, phi of every pair, the
    diagonal masked. It costs O(P^2 D) time and memory, so it is used for
    small point sets (P^2 D <= ``dense_entries``) or when ``dense=True``; it is
    also the reference the scalable path is tested against.

    The scalable path (``sparse_energies``) derives the same E_a without the
    P x P matrix. psi_att is constant for d <= delta, with value
    psi_att(delta), and psi_rep is constant for d >= repulsion_delta, with
    value psi_rep(repulsion_delta): the potentials' *plateau* values
    (``plateaus``). Write phi = plateau + (phi - plateau) in E_a. With n_c the
    points of class c (its samples in the batch + M proxies), point a has
    n_{l_a} - 1 other points of its class and P - n_{l_a} of other classes, so

        E_a = (n_{l_a} - 1) psi_att(delta) + (P - n_{l_a}) psi_rep(repulsion_delta)
              + sum_{b != a} [phi(d_ab, l_a = l_b) - plateau(l_a = l_b)].

    The first line needs no distance at all (``plateau_energies``). In the
    sum, a pair adds exactly 0 unless it is off its plateau: a same-class pair
    farther apart than delta, or a pair of different classes closer than
    repulsion_delta. So the sum splits into
      * the search (``candidate_pairs``, no gradient): a superset of the
        off-plateau pairs, from matrix products in blocks with a margin for
        rounding; among proxies of different classes, the proxy
        ``NeighborList`` (a Verlet list, whose radius shrinks to keep it
        sparse as the proxies contract; a dense blocked search while they
        cluster within the cutoff or move too fast for any list);
      * the energy (``pair_energies``, with gradient): phi - plateau of each
        candidate pair, exactly, from its coordinate differences, added to
        both of its points (each unordered pair is two ordered terms of U);
      * the pairs of two proxies of one class, always summed from each
        class's M x M Gram matrix (``intra_class_energies``).
    Subclasses give ``attraction(sq)`` and ``repulsion(sq)`` as functions of
    sq = d^2 (constant on the plateaus).
    """

    # entries of one block of a distance computation (bounds the memory)
    chunk_entries = 2**22
    # gathered coordinates per block when pairs are filtered by their distances
    # (small blocks stay in the CPU's caches; large fresh buffers cost page faults)
    gather_entries = 2**17
    # dense=None uses the dense path while P * P * D is at most this
    dense_entries = 2**20
    # skin of the proxy neighbour list, in units of repulsion_delta
    neighbor_skin = 1.0

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
        self.neighbor_list = NeighborList(self.chunk_entries)
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

    def cast_types(self, dtype, device):
        # never below float32: half-precision inputs were upcast by CheckedForwardMixin
        self.proxies.data = c_f.to_device(self.proxies.data, device=device, dtype=dtype)

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        c_f.indices_tuple_not_supported(indices_tuple)
        checks.ref_not_supported(self, embeddings, labels, ref_emb, ref_labels)
        self.cast_types(embeddings.dtype, embeddings.device)
        B = len(embeddings)
        embeddings = self.distance.maybe_normalize(embeddings)
        # PML's regularizers take one row per vector: (num_classes * proxies_per_class, D)
        raw_proxies = self.proxies.reshape(-1, self.embedding_size)
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
        return self.distance.normalize(raw_proxies) if self.normalize_proxies else raw_proxies

    def use_dense(self, num_points):
        if self.dense is None:
            return num_points**2 * self.embedding_size <= self.dense_entries
        return self.dense

    def dense_energies(self, points, point_labels):
        """E_a = sum_{b != a} phi(d_ab, l_a = l_b) over all P x P pairs: the
        spec's sum as written (no plateaus, no search)."""
        sq = (points.unsqueeze(1) - points.unsqueeze(0)).pow(2).sum(dim=2)
        same = point_labels.unsqueeze(1) == point_labels.unsqueeze(0)
        # both potentials are clamped, so torch.where's gradient is clean (also at d = 0)
        phi = torch.where(same, self.attraction(sq), self.repulsion(sq))
        self_terms = torch.eye(len(points), dtype=torch.bool, device=points.device)
        if self.collect_stats:
            with torch.no_grad():
                inside, outside = self.plateaus(points.dtype, points.device)
                upper = torch.ones_like(same).triu(diagonal=1)
                off_plateau = upper & (phi != torch.where(same, inside, outside))
                self.num_attraction_pairs = int((off_plateau & same).sum())
                self.num_repulsion_pairs = int((off_plateau & ~same).sum())
                n, M = self.num_classes * self.proxies_per_class, self.proxies_per_class
                self.num_reanchored_proxies = self.num_searched_proxy_pairs = 0
                self.num_evaluated_proxy_pairs = n * (n - 1) // 2 - self.num_classes * M * (M - 1) // 2
        return phi.masked_fill(self_terms, 0).sum(dim=1)

    def sparse_energies(self, embeddings, raw_proxies, point_labels):
        """The same E_a from the plateau decomposition (see the class
        docstring): plateau counts + intra-class proxy pairs + the candidate
        pairs found by the search. The gradient goes through the proxies that
        are off a plateau only (those in a candidate pair, and the classes
        whose own proxies attract each other): the others add exact zeros, so
        the backward pass does not touch them."""
        B, N, M = len(embeddings), self.num_classes, self.proxies_per_class
        with torch.no_grad(), full_precision_matmul():  # the searches' rounding margins assume it
            proxies = self.proxy_points(raw_proxies)
            pairs, same = self.candidate_pairs(embeddings.detach(), proxies, point_labels)
            classes = self.attracting_classes(proxies.view(N, M, -1))
        # the pairs' points: all embeddings, and only the proxies in some pair
        rows = torch.unique(pairs[pairs >= B]) - B
        points = torch.cat([embeddings, self.proxy_points(torch.nn.functional.embedding(rows, raw_proxies))])
        local = torch.empty_like(point_labels)
        local[:B] = torch.arange(B, device=local.device)
        local[B + rows] = torch.arange(B, len(points), device=local.device)
        pair_energies = self.pair_energies(points, local[pairs], same)
        D = self.embedding_size
        own = self.proxy_points(raw_proxies.view(N, M, D)[classes].reshape(len(classes) * M, D))
        intra_class = self.intra_class_energies(own.view(len(classes), M, D))
        intra_class = raw_proxies.new_zeros(N, M).index_copy(0, classes, intra_class).reshape(-1)
        energies = self.plateau_energies(point_labels, embeddings.dtype)
        if self.collect_stats:
            self.num_attraction_pairs = int(same.sum())
            self.num_repulsion_pairs = int((~same).sum())
            self.num_reanchored_proxies = self.neighbor_list.last_reanchored
            self.num_searched_proxy_pairs = self.neighbor_list.last_searched
            self.num_evaluated_proxy_pairs = self.neighbor_list.last_evaluated
        return torch.cat(
            [
                energies[:B] + pair_energies[:B],
                (energies[B:] + intra_class).index_add(0, rows, pair_energies[B:]),
            ]
        )

    def proxy_labels(self, device):
        classes = torch.arange(self.num_classes, device=device)
        return classes.repeat_interleave(self.proxies_per_class)

    def plateaus(self, dtype, device):
        """attraction(delta^2) and repulsion(repulsion_delta^2), as tensors, so
        that potential - plateau is exactly 0 on the plateaus."""
        inside = self.attraction(torch.tensor(self.delta**2, dtype=dtype, device=device))
        outside = self.repulsion(torch.tensor(self.repulsion_delta**2, dtype=dtype, device=device))
        return inside, outside

    def plateau_energies(self, point_labels, dtype):
        """Per point: every other point counted at its plateau value."""
        inside, outside = self.plateaus(dtype, point_labels.device)
        class_sizes = torch.bincount(point_labels, minlength=self.num_classes)[point_labels]
        same = (class_sizes - 1).to(dtype)
        return inside * same + outside * (len(point_labels) - 1 - same)

    def attracting_classes(self, proxies):
        """The classes (indices) whose proxies (N, M, D) may be farther apart
        than delta (a margin for rounding): only their intra-class pairs can
        be off the attraction plateau."""
        gram = torch.bmm(proxies, proxies.transpose(1, 2))
        sq_norms = gram.diagonal(dim1=1, dim2=2)
        sq = sq_norms.unsqueeze(2) + sq_norms.unsqueeze(1) - 2 * gram
        max_norm = sq_norms.max().sqrt().item() if len(sq_norms) else 0.0
        threshold = self.delta**2 - rounding_slack(max_norm, proxies.shape[2], proxies.dtype)
        return (sq > threshold).flatten(1).any(dim=1).nonzero().squeeze(1)

    def intra_class_energies(self, proxies):
        """(N, M): for each proxy, the sum over the other proxies of its class of
        attraction - plateau, from the class's Gram matrix (attraction is flat
        near 0, so the rounding of |a|^2 + |b|^2 - 2 a.b does not matter there;
        the diagonal is on the plateau and adds exactly 0)."""
        inside = self.plateaus(proxies.dtype, proxies.device)[0]
        gram = torch.bmm(proxies, proxies.transpose(1, 2))
        sq_norms = gram.diagonal(dim1=1, dim2=2)
        sq = sq_norms.unsqueeze(2) + sq_norms.unsqueeze(1) - 2 * gram
        return (self.attraction(sq) - inside).sum(dim=2)

    def candidate_pairs(self, embeddings, proxies, point_labels):
        """Unordered pairs (i < j) of points (embeddings first, then proxies)
        that may be off the plateau, except those between two proxies of one
        class (see intra_class_energies): same-class pairs farther than delta
        and different-class pairs closer than repulsion_delta. A superset
        (margin for rounding). Returns a (2, K) index tensor and a bool mask
        of the same-class pairs."""
        B, M = len(embeddings), self.proxies_per_class
        labels, proxy_labels = point_labels[:B], point_labels[B:]
        emb_norms = torch.linalg.vector_norm(embeddings, dim=1)
        proxy_norms = torch.linalg.vector_norm(proxies, dim=1)
        max_norm = torch.maximum(emb_norms.max(), proxy_norms.max()).item()
        slack = rounding_slack(max_norm, embeddings.shape[1], embeddings.dtype)
        att_threshold = self.delta**2 - slack
        rep_threshold = self.repulsion_delta**2 + slack
        arange = torch.arange(B, device=labels.device)
        # embeddings among themselves
        emb_sq_norms, proxy_sq_norms = emb_norms.square(), proxy_norms.square()
        sq = emb_sq_norms.unsqueeze(1) + emb_sq_norms.unsqueeze(0) - 2 * embeddings @ embeddings.T
        same = labels.unsqueeze(1) == labels.unsqueeze(0)
        upper = arange.unsqueeze(1) < arange.unsqueeze(0)
        pairs = [(upper & torch.where(same, sq > att_threshold, sq < rep_threshold)).nonzero().T]
        # each embedding and the proxies of its class (all of them: M per embedding)
        own = B + labels.unsqueeze(1) * M + torch.arange(M, device=labels.device)
        pairs.append(torch.stack([arange.repeat_interleave(M), own.reshape(-1)]))
        # embeddings and the proxies of other classes, in blocks of rows
        step = max(1, self.chunk_entries // len(proxies))
        for start in range(0, B, step):
            sq = torch.addmm(
                proxy_sq_norms.unsqueeze(0), embeddings[start : start + step], proxies.T, alpha=-2
            )
            sq += emb_sq_norms[start : start + step].unsqueeze(1)
            row, col = (sq < rep_threshold).nonzero().unbind(1)
            row = row + start
            keep = labels[row] != proxy_labels[col]
            pairs.append(torch.stack([row[keep], B + col[keep]]))
        # proxies of different classes: the neighbour list (pairs within the cutoff by their coordinates)
        skin = self.neighbor_skin * self.repulsion_delta
        self.neighbor_list.chunk_entries = self.chunk_entries
        self.neighbor_list.gather_entries = self.gather_entries
        pairs.append(self.neighbor_list.update(proxies, M, self.repulsion_delta, skin) + B)
        pairs = torch.cat(pairs, dim=1)
        # a canonical order: the sums do not depend on the list's history (the
        # extra candidates it may hold add exact zeros)
        pairs = pairs[:, (pairs[0] * len(point_labels) + pairs[1]).argsort()]
        return pairs, point_labels[pairs[0]] == point_labels[pairs[1]]

    def pair_energies(self, points, pairs, same):
        """Per point: the sum over the given pairs containing it of
        potential - plateau (attraction for same-class pairs, else repulsion),
        in blocks (recomputed in the backward pass when there are several, so
        memory is bounded)."""
        energies = points.new_zeros(len(points))
        step = max(1, self.chunk_entries // points.shape[1])
        use_checkpoint = torch.is_grad_enabled() and points.requires_grad and pairs.shape[1] > step
        for start in range(0, pairs.shape[1], step):
            block, block_same = pairs[:, start : start + step], same[start : start + step]
            if use_checkpoint:
                terms = checkpoint(self.block_energies, points, block, block_same, use_reentrant=False)
            else:
                terms = self.block_energies(points, block, block_same)
            energies = energies.index_add(0, block[0], terms).index_add(0, block[1], terms)
        return energies

    def block_energies(self, points, pairs, same):
        inside, outside = self.plateaus(points.dtype, points.device)
        sq = pair_sq_distances(points, pairs)
        # both branches are finite (clamped), so torch.where's gradient is clean
        return torch.where(same, self.attraction(sq) - inside, self.repulsion(sq) - outside)

    def get_default_reducer(self):
        return SumReducer()

    def get_default_distance(self):
        return LpDistance(p=2, power=1, normalize_embeddings=True)

    def _sub_loss_names(self):
        return ["embedding_loss", "proxy_loss"]
