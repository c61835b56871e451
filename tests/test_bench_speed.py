"""The bench's faster paths give what the plain ones give: batches read at once (the same
samples, views and random state as item by item), the run's records (the same files as
PML's record keeper writes), and the order of the runs (the results in job order)."""

import filecmp

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_metric_learning.losses import ProxyAnchorLoss
from pytorch_metric_learning.utils import logging_presets

from pml_fieldlosses.app.bench import features, records, scheduler


def item_by_item(dataset, indices):
    """The batch as a DataLoader reads a dataset without ``__getitems__``."""
    return torch.utils.data.default_collate([dataset[i] for i in indices])


@st.composite
def views_case(draw):
    num_views = draw(st.integers(1, 5))
    width = draw(st.integers(1, 6))
    rows = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((rows + v, width)).astype(np.float32) for v in range(num_views)]
    rows_of = [rng.permutation(rows + v)[:rows] for v in range(num_views)]
    labels = rng.integers(0, 4, rows)
    indices = draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=20))
    return arrays, rows_of, labels, indices, seed


@settings(max_examples=30, deadline=None)
@given(views_case())
def test_a_batch_of_views_read_at_once_is_the_batch_read_item_by_item(case):
    arrays, rows, labels, indices, seed = case
    dataset = features.ViewsDataset(arrays, rows, labels)
    torch.manual_seed(seed)
    expected = item_by_item(dataset, indices)
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    got = features.collate(dataset.__getitems__(indices))
    assert torch.equal(torch.get_rng_state(), state)  # the same draws: later batches repeat too
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and torch.equal(a, b)
    torch.manual_seed(seed)
    samples = dataset.__getitems__(indices)  # as a list of samples, for any collate function
    assert len(samples) == len(indices)
    for a, b in zip(torch.utils.data.default_collate(samples), expected):
        assert torch.equal(a, b)


@settings(max_examples=30, deadline=None)
@given(views_case(), st.booleans())
def test_rows_read_at_once_are_the_rows_read_item_by_item(case, images):
    arrays, rows, labels, indices, _ = case
    inputs = arrays[0]
    if images:  # uint8 images, as the trained trunks read them
        inputs = (np.abs(inputs[:, :, None, None] * 50) % 256).astype(np.uint8).repeat(3, axis=3)
    dataset = features.ArrayDataset(inputs, rows[0], labels)
    for a, b in zip(features.collate(dataset.__getitems__(indices)), item_by_item(dataset, indices)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    if images:
        got = features.collate_eval_images(dataset.__getitems__(indices))
        expected = features.collate_eval_images([dataset[i] for i in indices])
        assert all(torch.equal(a, b) for a, b in zip(got, expected))


class PlainViews(features.ViewsDataset):
    __getitems__ = None  # read item by item


def test_a_data_loader_reads_whole_batches_of_the_memory_mapped_features(tmp_path):
    path = tmp_path / "view.npy"
    np.save(path, np.arange(40, dtype=np.float32).reshape(10, 4))
    mapped = np.load(path, mmap_mode="r")
    dataset = features.ViewsDataset([mapped, mapped[::-1]], [np.arange(10), np.arange(10)], np.arange(10))
    torch.manual_seed(0)
    batches = list(torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=features.collate))
    plain = PlainViews([mapped, mapped[::-1]], [np.arange(10), np.arange(10)], np.arange(10))
    torch.manual_seed(0)  # a DataLoader draws its base seed: the same draws, then the same views
    expected = list(torch.utils.data.DataLoader(plain, batch_size=4))
    assert len(batches) == 3
    assert all(torch.equal(a, b) for x, y in zip(batches, expected) for a, b in zip(x, y))


def record_once(record_keeper, loss, iteration):
    """What PML's hooks record of a loss (its parameters included), then saved."""
    record_keeper.update_records({"metric_loss": loss}, iteration, recursive_types=[torch.nn.Module, dict])
    record_keeper.update_records(
        {"loss": torch.tensor(1.5 + iteration), "lr": 0.01}, iteration, parent_name="x"
    )
    record_keeper.save_records()


def test_the_run_records_are_the_files_of_pml_record_keeper(tmp_path):
    torch.manual_seed(0)
    loss = ProxyAnchorLoss(5, 3)  # a (5, 3) parameter: recorded as a list, not saved
    plain, _, plain_tb = logging_presets.get_record_keeper(str(tmp_path / "plain"), str(tmp_path / "tb1"))
    fast, writer, fast_tb = records.get_record_keeper(str(tmp_path / "fast"), str(tmp_path / "tb2"))
    for iteration in range(3):
        record_once(plain, loss, iteration)
        record_once(fast, loss, iteration)
    plain_tb.close()
    fast_tb.close()
    writer.sync()
    names = sorted(p.name for p in (tmp_path / "plain").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "fast").iterdir())
    assert "logs.db" in names and "metric_loss_ProxyAnchorLoss__parameters.csv" in names
    for name in names:
        assert filecmp.cmp(tmp_path / "plain" / name, tmp_path / "fast" / name, shallow=False), name


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(0, 100)), min_size=1, max_size=8))
def test_a_free_worker_takes_the_first_job_of_unknown_cost_else_the_costliest(costs):
    pending = list(enumerate(range(len(costs))))
    position = scheduler.next_job(pending, lambda job: costs[job])
    unknown = [i for i, c in enumerate(costs) if c is None]
    if unknown:
        assert position == unknown[0]
    else:
        assert costs[position] == max(costs) and position == costs.index(max(costs))
    assert scheduler.next_job(pending, None) == 0


def square(shared, job, report):
    return shared * job


@pytest.mark.parametrize("workers", [1, 2])
def test_jobs_taken_longest_first_give_their_results_in_job_order(workers):
    jobs = [3, 1, 4, 1, 5, 9, 2, 6]
    started = []

    def on_event(kind, job, value):
        if kind == "done":
            started.append(job)

    got = scheduler.run_jobs(square, 2, jobs, workers, on_event, cost=lambda job: float(job))
    assert got == [2 * job for job in jobs]
    assert sorted(started) == sorted(jobs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_runs_multi_tensor_adamw_gives_the_default_adamws_parameters_bit_for_bit(seed):
    """bench.run.optimisation's AdamWs (foreach=True) train every part to the same parameters,
    bit for bit, as torch's default AdamW on a CPU (one tensor at a time), through steps with
    gradients from 1e-30 to 1e3, zeros, a part without gradients at some steps and the StepLR's
    decays (its warm-up: a frozen trunk)."""
    from types import SimpleNamespace

    from pml_fieldlosses.app.bench.run import optimisation

    config = SimpleNamespace(
        lr=1e-2, loss_lr_multiplier=10.0, weight_decay=1e-4, lr_decay_epochs=2, lr_decay=0.5, grad_clip=None
    )
    g = torch.Generator().manual_seed(seed)

    def models():
        torch.manual_seed(seed)
        return {
            "trunk": torch.nn.Linear(7, 5),
            "embedder": torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 3)),
            "metric_loss": ProxyAnchorLoss(6, 3),
        }

    fast, plain = models(), models()
    fast_optimizers, fast_schedulers, _ = optimisation(fast, config, trunk_lr_multiplier=0.1)
    plain_optimizers = {
        key: torch.optim.AdamW(
            plain[key.removesuffix("_optimizer")].parameters(),
            optimizer.defaults["lr"],
            weight_decay=config.weight_decay,
        )
        for key, optimizer in fast_optimizers.items()
    }
    plain_schedulers = [
        torch.optim.lr_scheduler.StepLR(optimizer, config.lr_decay_epochs, config.lr_decay)
        for optimizer in plain_optimizers.values()
    ]
    assert set(fast_optimizers) == {"trunk_optimizer", "embedder_optimizer", "metric_loss_optimizer"}
    assert all(o.defaults["foreach"] is None for o in plain_optimizers.values())

    def gradient(shape, step):
        scale = 10.0 ** torch.randint(-30, 4, (), generator=g).item()
        return torch.randn(shape, generator=g) * scale * (step % 5 != 4)  # zeros at some steps

    for step in range(12):
        grads = [
            None if name == "trunk" and step < 3 else gradient(p.shape, step)
            for name in fast
            for p in fast[name].parameters()
        ]
        for part in (fast, plain):
            for p, grad in zip([p for name in part for p in part[name].parameters()], grads):
                p.grad = None if grad is None else grad.clone()
        for o in list(fast_optimizers.values()) + list(plain_optimizers.values()):
            o.step()
        if step % 3 == 2:
            for s in list(fast_schedulers.values()) + plain_schedulers:
                s.step()
    for name in fast:
        for a, b in zip(fast[name].parameters(), plain[name].parameters()):
            assert torch.equal(a, b), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_runs_gradient_clipper_gives_the_gradients_of_torchs_clip_grad_norm(dtype):
    """bench.run.GradClipper leaves out torch's scaling by exactly 1 (a norm up to max_norm):
    the gradients are clip_grad_norm_'s bit for bit at norms far below, just below, at, within
    torch's 1e-6 of and above max_norm, zero, inf and NaN; it counts the steps and those
    clipped, and a part without gradients is no step."""
    from pml_fieldlosses.app.bench.run import GradClipper

    max_norm = 10.0
    g = torch.Generator().manual_seed(0)
    direction = [torch.randn(3, 4, generator=g, dtype=dtype), torch.randn(5, generator=g, dtype=dtype)]
    length = torch.sqrt(sum((d * d).sum() for d in direction))
    direction = [d / length for d in direction]
    norms = [0.0, 1e-3, 9.0, max_norm - 1e-3, max_norm - 5e-7, max_norm, max_norm + 1e-7, 11.0, 1e6]
    cases = [[d * n for d in direction] for n in norms]
    cases += [[direction[0], direction[1] * float("inf")], [direction[0] * float("nan"), direction[1]]]
    clipped = 0
    for grads in cases:
        ours = [torch.nn.Parameter(torch.zeros_like(d)) for d in direction]
        theirs = [torch.nn.Parameter(torch.zeros_like(d)) for d in direction]
        for p, q, grad in zip(ours, theirs, grads):
            p.grad, q.grad = grad.clone(), grad.clone()
        clipper = GradClipper(ours, max_norm)
        clipper()
        norm = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
        clipped += int(norm > max_norm)
        for p, q in zip(ours, theirs):  # (NaN where theirs is NaN)
            assert torch.equal(p.grad.isnan(), q.grad.isnan())
            assert torch.equal(p.grad.nan_to_num(), q.grad.nan_to_num())
        assert (clipper.steps, clipper.clipped) == (1, int(norm > max_norm))
    assert clipped >= 3  # 11, 1e6 and inf at least (1e-7 above may round to max_norm; NaN compares false)
    frozen = GradClipper([torch.nn.Parameter(torch.zeros(2))], max_norm)
    frozen()
    assert (frozen.steps, frozen.clipped, frozen.clipped_fraction()) == (0, 0, 0.0)


def test_the_samples_of_a_batch_read_at_once_are_a_sequence_of_pairs():
    """features.Samples, what __getitems__ returns, is the list of (input, label) a collate
    function may read: by index (negative too), by slice, by iteration, with its length."""
    inputs, labels = torch.arange(12.0).reshape(4, 3), torch.tensor([3, 1, 2, 0])
    samples = features.Samples(inputs, labels)
    pairs = list(zip(inputs.unbind(0), labels.unbind(0)))
    assert len(samples) == 4
    for got in (
        list(samples),
        [samples[i] for i in range(4)],
        samples[:],
        [samples[i - 4] for i in range(4)],
    ):
        assert len(got) == 4
        assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, pairs))
    assert [int(label) for _, label in samples[1:4:2]] == [1, 0]
    with pytest.raises(IndexError):
        samples[4]
    assert features.collate(samples) == [inputs, labels]
    assert all(torch.equal(a, b) for a, b in zip(torch.utils.data.default_collate(samples), [inputs, labels]))
