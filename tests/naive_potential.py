"""Naive references for the potential-field losses (Bhatnagar & Ahuja, CVPR 2025;
docs/derivations.md, 'The energy'): an explicit Python loop over all ordered
pairs of points (slow on purpose, small inputs only). It takes raw tensors
x (B, D), labels y (list or tensor), proxies (N, M, D) and returns the
per-point energies [E_a] (batch points first, then the proxies class-major);
the loss with a SumReducer is their sum. It checks both paths of the losses
(the dense one, all pairs, and the scalable one); on longer runs the scalable
path is compared with the loss's own dense path (``dense_reference``). At the
end: the test cases shared by the PFML and CPML test files."""

import copy

import torch

from pml_fieldlosses import losses

from .helpers import (
    EMBEDDING_SIZE,
    LOSS_DTYPE,
    NUM_CLASSES,
    assert_close,
    generator_for,
    gradients,
    make_embeddings,
    make_labels,
)
from .naive import nrm

FLOOR = 1e-3  # PotentialFieldLoss.distance_floor


def pfml_potential(d, same, delta, alpha, repulsion_delta):
    # Eq. 1, 2 with the distance floor in the repulsion
    if same:
        return -(torch.clamp(d, min=delta) ** (-alpha))
    return torch.clamp(torch.clamp(d, min=FLOOR), max=repulsion_delta) ** (-alpha)


def cpml_potential(d, same, delta, repulsion_delta):
    # supplement A attraction, mirrored repulsion
    if same:
        return torch.clamp(d, min=delta) ** 2
    return -(torch.clamp(d, max=repulsion_delta) ** 2)


def points_and_labels(x, y, proxies, normalize_proxies):
    y = [int(v) for v in y]
    N, M = proxies.shape[0], proxies.shape[1]
    points = [nrm(x[i]) for i in range(len(y))]
    labels = list(y)
    for j in range(N):
        for k in range(M):
            points.append(nrm(proxies[j, k]) if normalize_proxies else proxies[j, k])
            labels.append(j)
    return points, labels


def naive_energies(x, y, proxies, potential, normalize_proxies=True):
    """E_a = sum over b != a of potential(d_ab, same class), explicit loops."""
    points, labels = points_and_labels(x, y, proxies, normalize_proxies)
    energies = []
    for a in range(len(points)):
        energy = 0
        for b in range(len(points)):
            if b == a:
                continue
            sq = torch.sum((points[a] - points[b]) ** 2)
            # d = 0 for coincident points, without differentiating sqrt at 0
            d = torch.sqrt(sq) if sq > 0 else sq
            energy = energy + potential(d, labels[a] == labels[b])
        energies.append(energy)
    return energies


def naive_pfml(x, y, proxies, delta, alpha, repulsion_delta=None, normalize_proxies=True):
    rd = delta if repulsion_delta is None else repulsion_delta
    return naive_energies(
        x, y, proxies, lambda d, same: pfml_potential(d, same, delta, alpha, rd), normalize_proxies
    )


def naive_cpml(x, y, proxies, delta, repulsion_delta=None, normalize_proxies=True):
    rd = delta if repulsion_delta is None else repulsion_delta
    return naive_energies(
        x, y, proxies, lambda d, same: cpml_potential(d, same, delta, rd), normalize_proxies
    )


def dense_reference(loss_fn, x, labels):
    """The loss's dense path (all P x P pairs, ``dense=True``) on a copy of
    ``loss_fn`` with the same proxies: the value and the gradients with
    respect to x and the proxies."""
    dense = copy.deepcopy(loss_fn)
    dense.dense = True
    x = x.detach().clone().requires_grad_()
    loss = dense(x, labels)
    return (loss, *torch.autograd.grad(loss, [x, dense.proxies]))


def check_dense_reference(loss_fn, x, labels, loss, grads, dtype=torch.float64):
    """``loss`` and ``grads`` (w.r.t. x and the proxies) of the scalable path
    equal the loss's dense path."""
    expected, *expected_grads = dense_reference(loss_fn, x, labels)
    assert_close(loss, expected, dtype)
    for grad, expected_grad in zip(grads, expected_grads):
        assert_close(grad, expected_grad, dtype)


# Each case: (builder of our loss from (num_classes, embedding_size, proxies_per_class, **kw),
# naive per-point energies (x, y, proxies, normalize_proxies)).
# The hyperparameters make every term matter for normalised points in 6 dimensions (the
# "defaults" cases check the default values; their small radius leaves few repelling pairs).
def _case(loss_name, delta, alpha=None, repulsion_delta=None, default=False):
    def build(C, D, M, **kw):
        if default:
            kw = dict(proxies_per_class=M, **kw)
        else:
            kw = dict(proxies_per_class=M, delta=delta, repulsion_delta=repulsion_delta, **kw)
            if alpha is not None:
                kw["alpha"] = alpha
        return getattr(losses, loss_name)(C, D, **kw)

    def naive(x, y, proxies, normalize_proxies=True):
        if alpha is None:
            return naive_cpml(x, y, proxies, delta, repulsion_delta, normalize_proxies)
        return naive_pfml(x, y, proxies, delta, alpha, repulsion_delta, normalize_proxies)

    return build, naive


PFML_CASES = {
    "defaults": _case("PotentialFieldLoss", 0.2, 4.0, default=True),
    "delta0.8_alpha2": _case("PotentialFieldLoss", 0.8, 2.0),
    "delta0.6_alpha6_rdelta1.1": _case("PotentialFieldLoss", 0.6, 6.0, 1.1),
    "delta1_alpha0.5_rdelta0.7": _case("PotentialFieldLoss", 1.0, 0.5, 0.7),
}
CPML_CASES = {
    "defaults": _case("ContrastivePotentialLoss", 0.2, default=True),
    "delta0.8": _case("ContrastivePotentialLoss", 0.8),
    "delta0.6_rdelta1.2": _case("ContrastivePotentialLoss", 0.6, None, 1.2),
}


def random_inputs(batch_size, num_classes, M, dtype, g, normalized=False, proxy_scale=1.0):
    x = make_embeddings(batch_size, torch.float64, g, normalized)
    proxies = torch.randn(num_classes, M, EMBEDDING_SIZE, generator=g, dtype=torch.float64) * proxy_scale
    return x.to(dtype), proxies.to(dtype)


def check_against_naive(loss_fn, naive, x, labels, proxies, dtype, normalize_proxies=True):
    """Our loss (default SumReducer) == sum of the naive per-point energies,
    and the gradients w.r.t. embeddings and proxies agree."""
    x = x.clone().requires_grad_()
    with torch.no_grad():
        loss_fn.proxies.copy_(proxies)
    loss = loss_fn(x, torch.tensor(labels))
    # half inputs are computed in float32, and the proxies stay float32 (LOSS_DTYPE)
    assert loss.dtype == LOSS_DTYPE.get(dtype, dtype) and loss_fn.proxies.dtype == loss.dtype
    grad_x, grad_p = gradients(loss, [x, loss_fn.proxies])

    x64 = x.detach().double().requires_grad_()
    p64 = proxies.detach().double().requires_grad_()
    expected = sum(naive(x64, labels, p64, normalize_proxies))
    expected_grad_x, expected_grad_p = gradients(expected, [x64, p64])
    assert_close(loss, expected, dtype)
    assert_close(grad_x, expected_grad_x, dtype)
    assert_close(grad_p, expected_grad_p, dtype)


# the loss's ways to the energies: the dense sum over all pairs, and the scalable path with
# each of its searches (all pairs in one product; the embeddings' pairs, the classes' and the
# neighbour list apart), as (dense, all_pairs_entries)
PATHS = {"dense": (True, 0), "all-pairs": (False, 2**62), "neighbour-list": (False, 0)}
# the scalable path's searches alone, as all_pairs_entries
SEARCHES = {path: entries for path, (dense, entries) in PATHS.items() if not dense}


def on_search(loss_fn, search):
    """``loss_fn`` made to find its pairs by ``search`` (SEARCHES) at every update: all pairs
    of any number of points in one product, or the neighbour list at any number."""
    loss_fn.all_pairs_entries = SEARCHES[search]
    loss_fn.list_for_few_points = False  # (for few points, which the neighbour list's 0 never is)
    return loss_fn


def on_path(build, path, *args, **kwargs):
    """The loss ``build(*args, **kwargs)`` taking the path ``path`` (PATHS)."""
    dense, all_pairs_entries = PATHS[path]
    loss_fn = build(*args, dense=dense, **kwargs)
    if not dense:
        on_search(loss_fn, path)
    return loss_fn


def check_cases_match_naive(cases, case, pattern, dtype, normalized, path):
    g = generator_for(case, pattern, dtype, normalized)
    build, naive = cases[case]
    labels = make_labels(pattern, g)
    x, proxies = random_inputs(len(labels), NUM_CLASSES, 2, dtype, g, normalized)
    loss_fn = on_path(build, path, NUM_CLASSES, EMBEDDING_SIZE, 2).to(dtype)
    check_against_naive(loss_fn, naive, x, labels, proxies, dtype)
