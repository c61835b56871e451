"""The papers' claims, one entry each: id, paper, section, the claim in one
sentence, the experiment in words, and the comparisons that test it.

A comparison names two arms (tuples of catalog loss names, e.g. ``PFML[alpha=2]``;
an arm of several losses is their mean per seed), the measure compared, the label
noise of the runs and the claimed direction (verdict.DIRECTIONS). Every run is the
bench's run of that loss and seed; a run that several claims need is trained once.
Adding a claim is adding one ``Claim`` to CLAIMS.
"""

from dataclasses import dataclass

from .. import catalog
from ..errors import UsageError
from .verdict import DIRECTIONS

EARLY_EPOCH = 3  # the "fixed small number of epochs" of the convergence claim

# measure -> (what it is, its unit in the report)
MEASURES = {
    "map": ("test MAP@R of the selected epoch", "MAP@R"),
    "noise_drop": ("test MAP@R without label noise minus with it (same seed)", "MAP@R lost"),
    "epochs_to_best": ("epoch of the best validation MAP@R", "epochs"),
    "val_map_early": (f"validation MAP@R after epoch {EARLY_EPOCH}", "val MAP@R"),
    "proxy_distance": (
        "mean distance from each proxy to the nearest training embedding of its class (both normalised)",
        "distance",
    ),
}

PFML_PAPER = "PFML (Bhatnagar & Ahuja, CVPR 2025)"
MF_PAPER = "Mean field (ICLR 2024)"
DRML_PAPER = "DRML (Zheng et al., ICCV 2021)"
NOISE_LEVELS = (0.1, 0.2, 0.4)


@dataclass(frozen=True)
class Comparison:
    a: tuple  # loss names; their mean per seed is one arm
    b: tuple
    direction: str  # "greater": a > b is claimed; "less": a < b; "none": no difference
    measure: str = "map"
    noise: float = 0.0  # the label noise of the runs ("noise_drop": of the noisy runs)

    def runs(self):
        """{(label noise, loss)} this comparison reads."""
        levels = {0.0, self.noise} if self.measure == "noise_drop" else {self.noise}
        return {(level, name) for level in levels for name in self.a + self.b}

    @property
    def label(self):
        symbol = {"greater": ">", "less": "<", "none": "≈"}[self.direction]
        noise = f" at {self.noise:.0%} noise" if self.noise else ""
        return f"{_arm(self.a)} {symbol} {_arm(self.b)} ({self.measure}{noise})"


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    section: str
    claim: str
    experiment: str
    comparisons: tuple
    plot: str = "arms"  # "arms": each arm's measure; "noise": MAP@R against label noise


def _arm(names):
    return names[0] if len(names) == 1 else "mean(" + ", ".join(names) + ")"


def _c(a, b, direction, measure="map", noise=0.0):
    a = (a,) if isinstance(a, str) else tuple(a)
    b = (b,) if isinstance(b, str) else tuple(b)
    return Comparison(a, b, direction, measure, noise)


# PFML is the bench's PFML (delta = 0.4 selected on emoji, alpha = 4, M = 2 proxies per class)
CLAIMS = (
    Claim(
        "pfml-alpha",
        PFML_PAPER,
        "§4.5.3",
        "A decaying field beats none: α = 0 < α ∈ {1, 2} < α ∈ {3, 4, 6}.",
        "PFML with α = 0, 1, 2, 3, 4 (the bench's PFML), 6; test MAP@R; each group's mean per seed.",
        (
            _c(("PFML[alpha=1]", "PFML[alpha=2]"), "PFML[alpha=0]", "greater"),
            _c(("PFML[alpha=3]", "PFML", "PFML[alpha=6]"), ("PFML[alpha=1]", "PFML[alpha=2]"), "greater"),
        ),
    ),
    Claim(
        "pfml-delta-rep",
        PFML_PAPER,
        "§4.5 (δ_rep ablation)",
        "A repulsion radius larger than the attraction radius (δ_rep > δ_att) hurts.",
        "PFML with δ_att = 0.4 (the bench's δ) and δ_rep = 0.4 (the bench's PFML), 0.6, 0.8; test MAP@R.",
        (
            _c("PFML[repulsion_delta=0.6]", "PFML", "less"),
            _c("PFML[repulsion_delta=0.8]", "PFML", "less"),
        ),
    ),
    Claim(
        "pfml-proxies",
        PFML_PAPER,
        "§4.5 (M ablation)",
        "More proxies per class help up to a point (M ∈ {1, 2, 4, 8}).",
        "PFML with M = 1, 2 (the bench's PFML), 4, 8 proxies per class; test MAP@R: M ∈ {2, 4} beat "
        "M = 1 (they help), and M = 8 falls below M ∈ {2, 4} (up to a point).",
        (
            _c(("PFML", "PFML[proxies_per_class=4]"), "PFML[proxies_per_class=1]", "greater"),
            _c("PFML[proxies_per_class=8]", ("PFML", "PFML[proxies_per_class=4]"), "less"),
        ),
    ),
    Claim(
        "pfml-noise",
        PFML_PAPER,
        "§4.3",
        "Under 10/20/40 % symmetric label noise PFML loses less than ProxyAnchor and the pair losses.",
        "PFML, ProxyAnchor, MultiSimilarity and Contrastive trained with 0, 10, 20, 40 % of the training "
        "labels changed to another class (the bench's --label-noise); the measure is the test MAP@R lost "
        "to the noise (clean run minus noisy run, same seed); pair losses: mean of MultiSimilarity and "
        "Contrastive.",
        tuple(
            comparison
            for level in NOISE_LEVELS
            for comparison in (
                _c("PFML", "ProxyAnchor", "less", "noise_drop", level),
                _c("PFML", ("MultiSimilarity", "Contrastive"), "less", "noise_drop", level),
            )
        ),
        plot="noise",
    ),
    Claim(
        "pfml-proxies-near-data",
        PFML_PAPER,
        "§3.4, §4.4",
        "PFML's proxies end closer to the data they represent than CPML's and ProxyAnchor's.",
        "The bench's PFML, CPML and ProxyAnchor; after training, the selected model's mean distance "
        "from each proxy to the nearest training embedding of its class (proxies and embeddings "
        "L2-normalised).",
        (
            _c("PFML", "CPML", "less", "proxy_distance"),
            _c("PFML", "ProxyAnchor", "less", "proxy_distance"),
        ),
    ),
    Claim(
        "pfml-beats-cpml",
        PFML_PAPER,
        "§4.4, supplement §A",
        "CPML, the non-decaying (contrastive) potential, trails PFML.",
        "The bench's PFML and CPML (same δ, M and protocol); test MAP@R.",
        (_c("PFML", "CPML", "greater"),),
    ),
    Claim(
        "mf-converge-faster",
        MF_PAPER,
        "§4",
        "The mean-field losses converge faster than ProxyAnchor.",
        f"The bench's MFCont, MFCWMS and ProxyAnchor: the epoch of the best validation MAP@R (fewer is "
        f"faster) and the validation MAP@R after epoch {EARLY_EPOCH} (higher is faster).",
        (
            _c("MFCont", "ProxyAnchor", "less", "epochs_to_best"),
            _c("MFCWMS", "ProxyAnchor", "less", "epochs_to_best"),
            _c("MFCont", "ProxyAnchor", "greater", "val_map_early"),
            _c("MFCWMS", "ProxyAnchor", "greater", "val_map_early"),
        ),
    ),
    Claim(
        "mf-reg-no-effect",
        MF_PAPER,
        "§4 (λ_MF)",
        "The mean-field regulariser's weight has no significant effect.",
        "MFCont and MFCWMS with mf_reg_weight = 0 (the bench's, the official README's) and 1; test MAP@R.",
        (
            _c("MFCont[mf_reg_weight=1]", "MFCont", "none"),
            _c("MFCWMS[mf_reg_weight=1]", "MFCWMS", "none"),
        ),
    ),
    Claim(
        "drml-lifts-base",
        DRML_PAPER,
        "supplement",
        "The relational head lifts its base loss, for ProxyAnchor, a triplet loss with a miner, and CosFace.",
        "Each base loss with the bench's Linear embedder against the same loss (same margin) in the DRML "
        "head (4 branches): ProxyAnchor, Triplet (PML's TripletMarginLoss with a semi-hard "
        "TripletMarginMiner), CosFace; test MAP@R.",
        (
            _c("DRML-ProxyAnchor", "ProxyAnchor", "greater"),
            _c("DRML-Triplet", "Triplet", "greater"),
            _c("DRML-CosFace", "CosFace", "greater"),
        ),
    ),
)


def get_claims(ids=None):
    """The claims with ``ids`` (all when None), in table order; a clear error for an unknown id."""
    if ids is None:
        return CLAIMS
    known = {claim.id: claim for claim in CLAIMS}
    if not ids:
        raise UsageError(f"no claim ids given (None: all); available: {', '.join(known)}")
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise UsageError(f"unknown claim {', '.join(map(repr, unknown))}; available: {', '.join(known)}")
    return tuple(claim for claim in CLAIMS if claim.id in ids)


def validate(claims=CLAIMS):
    """Check every claim: unique ids, known measures and directions, losses the
    catalog builds (NAME[key=value] included). Raises ValueError naming the claim."""
    ids = [claim.id for claim in claims]
    if len(set(ids)) != len(ids):
        raise ValueError(f"claim ids must be unique: {ids}")
    for claim in claims:
        if not claim.comparisons:
            raise ValueError(f"claim {claim.id} has no comparison")
        if claim.plot not in ("arms", "noise"):
            raise ValueError(f"claim {claim.id}: unknown plot {claim.plot!r}")
        for comparison in claim.comparisons:
            if comparison.measure not in MEASURES:
                raise ValueError(f"claim {claim.id}: unknown measure {comparison.measure!r}")
            if comparison.direction not in DIRECTIONS:
                raise ValueError(f"claim {claim.id}: unknown direction {comparison.direction!r}")
            if not 0 <= comparison.noise < 1:
                raise ValueError(f"claim {claim.id}: label noise {comparison.noise} not in [0, 1)")
            if comparison.measure == "noise_drop" and not comparison.noise:
                raise ValueError(f"claim {claim.id}: noise_drop needs a noise level above 0")
            if not comparison.a or not comparison.b or set(comparison.a) & set(comparison.b):
                raise ValueError(f"claim {claim.id}: {comparison.label} needs two disjoint, non-empty arms")
            for name in comparison.a + comparison.b:
                try:
                    catalog.get_entry(name)
                except ValueError as e:
                    raise ValueError(f"claim {claim.id}: {e}") from None
    return True


def runs_needed(claims):
    """{label noise: [loss names]} of every run the claims read, each once, in first-use order."""
    needed = {}
    for claim in claims:
        for comparison in claim.comparisons:
            for name in comparison.a + comparison.b:
                for level, loss in sorted(comparison.runs()):
                    if loss == name and loss not in needed.setdefault(level, []):
                        needed[level].append(loss)
    return dict(sorted(needed.items()))
