import math
import warnings

import torch

from ..utils import checks
from .base_potential_loss import BasePotentialLoss


# "Potential Field Based Deep Metric Learning" (Bhatnagar & Ahuja, CVPR 2025,
# arXiv 2405.18560), Eq. 1-6; no official code exists.
class PotentialFieldLoss(BasePotentialLoss):
    """PFML: the energy of the embeddings and proxies in their potential field.

    With d the Euclidean distance between two points (embeddings and proxies,
    see BasePotentialLoss), the pair potentials are (Eq. 1, 2)
    attraction(d) = -max(d, delta)^(-alpha) (same class; no force within delta),
    repulsion(d) = max(min(d, repulsion_delta), distance_floor)^(-alpha)
    (other classes; no force beyond repulsion_delta). The default SumReducer
    gives the paper's U without its constant self terms (see docs/derivations.md,
    "The potential energy and its plateau decomposition").

    ``distance_floor`` (1e-3) bounds the repulsion of points that (nearly)
    coincide at 1e-3^(-alpha), with no force below it: the direction between
    coincident points is undefined, and nothing is ever NaN or inf.
    alpha = 0 makes both potentials constant (zero force, nothing is learned):
    it is allowed with a warning, as the paper lists alpha in [0, 6]; for a
    non-decaying potential use ContrastivePotentialLoss. alpha is refused when
    distance_floor^(-alpha) would exceed 1e24 (float32 headroom), and delta
    when delta^(-alpha) or delta^2 would come within 1e8 of float32's range
    (checks.check_fits_float32; float16/bfloat16 inputs are computed in
    float32), so nothing overflows in any supported dtype.
    Defaults: proxies_per_class=2 (paper: 2 for SOP, 15 for CUB-200 and
    Cars-196), delta=0.2 (paper's CV range [0.1, 0.3]), alpha=4 (paper's best
    range [3, 6]).
    ``dense``: None (default) sums all (B + N M)^2 pairs directly for small
    point sets and uses the scalable path otherwise (BasePotentialLoss);
    True or False forces one of them. Both give the same values.
    """

    distance_floor = 1e-3

    def __init__(
        self,
        num_classes,
        embedding_size,
        proxies_per_class=2,
        delta=0.2,
        alpha=4.0,
        repulsion_delta=None,
        normalize_proxies=True,
        dense=None,
        **kwargs,
    ):
        checks.check_non_negative("alpha", alpha)
        super().__init__(
            num_classes,
            embedding_size,
            proxies_per_class,
            delta,
            repulsion_delta,
            normalize_proxies,
            dense,
            **kwargs,
        )
        if not self.repulsion_delta > self.distance_floor:
            raise ValueError(
                f"repulsion_delta must be > distance_floor={self.distance_floor}, got {self.repulsion_delta}"
            )
        if alpha * math.log10(1 / self.distance_floor) > 24:
            raise ValueError(
                f"alpha={alpha} is too large: the repulsion at the distance floor, "
                f"{self.distance_floor}^-alpha, would exceed 1e24 (float32 overflow risk); "
                "the paper uses alpha in [0, 6]"
            )
        # the attraction's plateau -delta^-alpha (and the repulsion's, below)
        checks.check_fits_float32(
            f"delta**-alpha (delta={self.delta}, alpha={alpha})", lambda: float(self.delta) ** -float(alpha)
        )
        if alpha == 0:
            warnings.warn(
                "PotentialFieldLoss with alpha=0: both potentials are constant, so the loss has "
                "zero gradient everywhere; use alpha > 0 (paper: 3 to 6) or ContrastivePotentialLoss",
                stacklevel=2,
            )
        self.alpha = alpha
        self.add_to_recordable_attributes(list_of_names=["alpha"], is_stat=False)

    def attraction(self, sq):
        return -torch.clamp(sq, min=self.delta**2).pow(-self.alpha / 2)

    def repulsion(self, sq):
        return torch.clamp(sq, min=self.distance_floor**2, max=self.repulsion_delta**2).pow(-self.alpha / 2)
