import torch

from .base_potential_loss import BasePotentialLoss


# "Potential Field Based Deep Metric Learning" (Bhatnagar & Ahuja, CVPR 2025),
# supplement A: the contrastive-style, non-decaying ablation (CPML).
class ContrastivePotentialLoss(BasePotentialLoss):
    """CPML: PotentialFieldLoss with quadratic, non-decaying potentials.

    attraction(d) = max(d, delta)^2 (supplement A; no force within delta),
    repulsion(d) = -min(d, repulsion_delta)^2 (no force beyond repulsion_delta).

    The paper does not give the repulsion. We use the mirror of Eq. 2: PFML's
    pair potentials are -max(d, delta)^p and min(d, delta)^p with p = -alpha;
    CPML's are the same with p = 2 and the signs flipped (d^2 increases with
    d), so the ablation changes the exponent only: the plateaus, radii and
    everything else stay those of PFML. Its repulsive force 2d grows with
    distance up to repulsion_delta, i.e. it is non-decaying like the
    attraction, which is what the ablation is about; the Hadsell-style
    alternative [repulsion_delta - d]_+^2 has a force that decays with d and
    would mix both properties. Both potentials are functions of d^2, so no
    distance floor is needed (see docs/derivations.md, "The potential energy and
    its plateau decomposition").
    Defaults as PotentialFieldLoss: proxies_per_class=2, delta=0.2.
    """

    def __init__(
        self,
        num_classes,
        embedding_size,
        proxies_per_class=2,
        delta=0.2,
        repulsion_delta=None,
        normalize_proxies=True,
        dense=None,
        **kwargs,
    ):
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

    def attraction(self, sq):
        return torch.clamp(sq, min=self.delta**2)

    def repulsion(self, sq):
        return -torch.clamp(sq, max=self.repulsion_delta**2)
