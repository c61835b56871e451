"""An exact filter for all-pairs distance searches: a lower bound on squared
distances from a low-dimensional projection."""

import torch


class ProjectionBound:
    """For an orthonormal basis U (D x k) and a centre c, with
    p(x) = U^T (x - c) and r(x) = (x - c) - U p(x) (the residual),

        ||x - y||^2 = ||p(x) - p(y)||^2 + ||r(x) - r(y)||^2
                   >= ||p(x) - p(y)||^2 + (||r(x)|| - ||r(y)||)^2,

    a squared distance in k + 1 dimensions (the residual norm appended as a
    coordinate), so a block of bounds is one matrix product of length k + 3
    instead of D + 2. Any U with orthonormal columns and any c give a valid
    bound; a basis from a PCA of the points makes it tight when they lie near
    a k-dimensional affine subspace (and loose when they do not: then little
    is pruned, never anything wrong).

    Rounding. Everything is computed in float64 from the points (float32 ->
    float64 is exact). U comes from a float64 SVD; its defect
    e = ||U^T U - I||_F (~1e-15) makes the bound exceed the true squared
    distance by at most a factor 1 + 4e (the projector onto span(U) differs
    from U U^T by at most e / (1 - e) in norm), and the float64 products err by
    at most ``slack`` (the rounding_slack of a (D + k + 3)-long float64 product
    of points of norm <= max_norm, times 16, which also covers the centring and
    the residual). So a pair whose true squared distance is below t has
    bound < (t + slack) * (1 + 4e): ``candidates`` keeps exactly those, and
    ``lower`` turns a bound into a value <= the true squared distance.
    """

    def __init__(self, points, dims):
        self.useless_above = float("inf")  # set by the search when the filter passed too much
        sample = points.detach()
        if len(sample) > 8 * dims:  # the basis only needs to be good, not exact
            sample = sample[torch.linspace(0, len(sample) - 1, 8 * dims, device=sample.device).long()]
        centre = sample.mean(dim=0)
        _, _, vh = torch.linalg.svd(sample - centre, full_matrices=False)
        self.centre = centre.double()
        self.basis = torch.linalg.qr(vh[:dims].T.double()).Q
        eye = torch.eye(self.basis.shape[1], dtype=torch.float64, device=self.basis.device)
        self.defect = torch.linalg.matrix_norm(self.basis.T @ self.basis - eye).item()
        if not self.defect < 1e-6:
            raise ValueError(f"the projection basis is not orthonormal (defect {self.defect})")

    def coordinates(self, points):
        """(left, right, slack): rows such that left_i . right_j is the bound
        of points i and j, and the rounding slack of those products."""
        from .neighbor_list import rounding_slack

        x = points.detach().to(torch.float64) - self.centre
        projected = x @ self.basis
        residual = torch.linalg.vector_norm(x - projected @ self.basis.T, dim=1, keepdim=True)
        low = torch.cat([projected, residual], dim=1)
        sq_norms = low.square().sum(dim=1, keepdim=True)
        ones = torch.ones_like(sq_norms)
        max_norm = torch.linalg.vector_norm(x, dim=1).max().item() if len(x) else 0.0
        max_norm += torch.linalg.vector_norm(self.centre).item()
        slack = 16 * rounding_slack(max_norm, points.shape[1] + low.shape[1] + 2, torch.float64)
        return torch.cat([low, sq_norms, ones], dim=1), torch.cat([-2 * low, ones, sq_norms], dim=1), slack

    def candidates(self, bounds, threshold, slack):
        """Entries whose true squared distance may be below ``threshold``."""
        return bounds < (threshold + slack) * (1 + 4 * self.defect)

    def lower(self, bounds, slack):
        """Values <= the true squared distances."""
        return ((bounds - slack) / (1 + 4 * self.defect)).clamp(min=0)

    @property
    def length(self):
        """The length of the bound's matrix product (k + 3)."""
        return self.basis.shape[1] + 3
