"""The neighbour list on real data: the PotentialFieldLoss proxies at the end of a real
bench run (``pml-fieldlosses bench`` on a folder of 918 letters drawn by 286
fonts, the glyphs data set written as a folder; 367 training classes, 734 proxies,
D = 128, delta = 0.4) have contracted until nearly all their pairs lie just
outside the repulsion radius: the configuration where a neighbour list of the
largest radius holds every pair. tests/data/glyph_pfml_state.npz holds those
proxies and 2 048 real training embeddings through the run's embedder
(scripts/make_contracted_state.py made it). Training steps from there, with
the bench's proxy learning rate, keep a sparse list that is exact at every
step (counted work, never timed)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from pml_fieldlosses import losses

from .test_potential_neighbor_list import no_shrinking, proxy_pair_work, true_close_pairs

STATE = Path(__file__).parent / "data" / "glyph_pfml_state.npz"
CUTOFF = 0.4  # the bench's delta for PFML


def load_state():
    data = np.load(STATE)
    embeddings = torch.from_numpy(data["embeddings"].astype(np.float32))
    return torch.from_numpy(data["proxies"]), embeddings, torch.from_numpy(data["labels"])


def replay(steps, adaptive_skin=True, bfloat16=False):
    """``steps`` training steps of the proxies (Adam at the bench's lr 1e-2) on
    batches of the stored embeddings (32 classes x 4). Returns, per step, the
    proxy-pair work (entries searched + pair_cost per pair evaluated) as a
    fraction of a dense search, and checks that the neighbour list returned
    every pair within the cutoff. ``bfloat16``: the searches' products in
    bfloat16 (else float32)."""
    proxies, embeddings, labels = load_state()
    C, M, D = proxies.shape
    n = C * M
    loss_fn = losses.PotentialFieldLoss(C, D, proxies_per_class=M, delta=CUTOFF, dense=False)
    loss_fn.all_pairs_entries = 0  # the neighbour list, not the search of all pairs
    loss_fn.collect_stats = True
    loss_fn.bfloat16_search = bfloat16
    loss_fn.neighbor_list.adaptive_skin = adaptive_skin
    with torch.no_grad():
        loss_fn.proxies.copy_(proxies)
    returned = []
    update = loss_fn.neighbor_list.update
    loss_fn.neighbor_list.update = lambda *args: returned.append(update(*args)) or returned[-1]
    optimizer = torch.optim.Adam(loss_fn.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(labels, minlength=C)
    eligible = (counts >= 4).nonzero().squeeze(1)
    work = []
    for _ in range(steps):
        classes = eligible[torch.randperm(len(eligible), generator=g)[:32]]
        batch = torch.cat([(labels == c).nonzero().squeeze(1)[:4] for c in classes])
        flat = torch.nn.functional.normalize(loss_fn.proxies.detach().reshape(n, D), dim=1)
        optimizer.zero_grad()
        loss_fn(embeddings[batch], labels[batch]).backward()
        optimizer.step()
        listed = torch.zeros(n, n, dtype=torch.bool)
        listed[returned[-1][0], returned[-1][1]] = True
        assert not (true_close_pairs(flat, M, CUTOFF) & ~listed).any()
        work.append(proxy_pair_work(loss_fn) / (n * (n - 1) / 2))
    return work, loss_fn.neighbor_list


def test_the_stored_state_is_contracted():
    proxies, _, _ = load_state()
    C, M, D = proxies.shape
    flat = torch.nn.functional.normalize(proxies.reshape(C * M, D).double(), dim=1)
    distances = torch.pdist(flat)
    assert distances.median() < 0.6  # from 1.41 at the random start
    assert (distances < 2 * CUTOFF).double().mean() > 0.99  # within the largest radius, cutoff + skin
    assert not true_close_pairs(flat, M, CUTOFF).any()  # and none of different classes within the cutoff


@pytest.mark.parametrize("bfloat16", [False, True], ids=["float32", "bfloat16"])
def test_real_contracted_proxies_keep_a_sparse_exact_list(bfloat16):
    """After the first step (a build of all pairs), every step's work is a
    small fraction of a dense search and no step is dense; the list is
    exact at every step (checked inside replay). With bfloat16 products the
    build also evaluates the pairs between its bounds at the cutoff, of which
    this contracted state has many (its pairs lie just outside the cutoff)."""
    work, neighbors = replay(30, bfloat16=bfloat16)
    if bfloat16:
        assert 1.0 <= work[0] <= 1.5  # the build
    else:
        assert work[0] == pytest.approx(1.0, rel=0.2)  # the build
    assert max(work[1:]) < 0.2 and sum(work[1:]) / len(work[1:]) < 0.05, work
    assert neighbors.state.kept and neighbors.stats.num_dense_steps == 0


def test_without_shrinking_or_adaptive_skin_every_real_step_is_dense(monkeypatch):
    """The check above can fail: with the largest skin kept (no adaptive
    skin) and the radius never shrunk, the list is given up and every step
    searches all pairs."""
    no_shrinking(monkeypatch)
    work, neighbors = replay(6, adaptive_skin=False)
    assert not neighbors.state.kept and min(work) >= 1.0, work
