"""The trained trunk: EfficientNet-Lite0 cut at a layer, its first layers frozen and their
outputs cached, its last layers trained with the embedder (backbones.Lite0Layers, the
``efficientnet-lite0-partial`` backbone). Every cut composes to the whole pretrained trunk;
a small bench run trains the layers after the cut (BatchNorm statistics kept), leaves the
cache as the pretrained layers computed it, saves models that give back its test
embeddings, and resumes."""

import hashlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from pytorch_metric_learning import losses, trainers

from pml_fieldlosses.app import backbones, catalog
from pml_fieldlosses.app.backbones import LITE0_LAYERS, EfficientNetMultiLevel, Lite0Layers
from pml_fieldlosses.app.bench import BenchConfig, run_bench
from pml_fieldlosses.app.bench import run as bench_run
from pml_fieldlosses.app.bench.features import collate_eval_images
from pml_fieldlosses.app.bench.protocol import make_split
from pml_fieldlosses.app.datasets import load_image_folder

from .test_bench import folder, tiny_config  # noqa: F401 (the fixture)


def images(n=6, size=32):
    return torch.randint(0, 256, (n, 3, size, size), generator=torch.Generator().manual_seed(0)).float()


@pytest.mark.parametrize("cut", range(1, LITE0_LAYERS))
def test_every_cut_composes_to_the_whole_trunk_exactly(cut):
    whole = EfficientNetMultiLevel(32).eval()
    frozen, trained = Lite0Layers(32, 0, cut).eval(), Lite0Layers(32, cut, LITE0_LAYERS).eval()
    with torch.no_grad():
        cached = frozen(images())
        assert cached.shape == (6, frozen.out_features)
        assert torch.equal(trained(cached), whole(images()))
    assert trained.out_features == whole.out_features == 3888
    frozen_names = {name for name, _ in frozen.named_parameters()}
    trained_names = {name for name, _ in trained.named_parameters()}
    assert not frozen_names & trained_names  # every layer is in exactly one part
    assert len(list(frozen.parameters())) + len(list(trained.parameters())) == len(list(whole.parameters()))


def test_building_a_trunk_leaves_the_seeded_generator_as_it_was():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    Lite0Layers(32, backbones.PARTIAL_CUT, LITE0_LAYERS)
    assert torch.equal(torch.get_rng_state(), state)  # the embedder of a seed is the frozen trunk's


def test_the_cut_and_batchnorm_of_a_trained_trunk_are_part_of_the_protocol():
    frozen = BenchConfig().protocol()
    assert not {"trunk_cut", "freeze_batchnorm", "standardized"} & set(frozen)  # its folders keep their names
    partial = BenchConfig(backbone="efficientnet-lite0-partial").protocol()
    assert partial["trunk_cut"] == backbones.PARTIAL_CUT and partial["freeze_batchnorm"]
    finetune = BenchConfig(backbone="efficientnet-lite0-finetune").protocol()
    assert finetune["trunk_cut"] == 0 and finetune["trunk_warmup_epochs"] == 1
    assert "trunk_warmup_epochs" not in partial  # none: the folder keeps the name it had


def test_a_cut_outside_the_network_is_refused():
    for start, stop in [(5, 5), (-1, 4), (3, 19), (12, 7)]:
        with pytest.raises(ValueError, match="need 0 <= start < stop <= 18"):
            Lite0Layers(32, start, stop)


def test_the_backbones_are_one_network_cut_at_different_layers():
    assert backbones.get_backbone("efficientnet-lite0").frozen
    partial = backbones.get_backbone("efficientnet-lite0-partial")
    finetune = backbones.get_backbone("efficientnet-lite0-finetune")
    assert partial.frozen_part(32).stop == partial.trained_part(32).start == backbones.PARTIAL_CUT
    assert finetune.frozen_part is None and finetune.trained_part(32).start == 0
    assert partial.freeze_batchnorm and finetune.freeze_batchnorm
    assert partial.cache_tag != backbones.get_backbone("efficientnet-lite0").cache_tag


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_partial_trunk_learns_keeps_its_cache_and_resumes(folder, tmp_path, capsys, monkeypatch):  # noqa: F811
    seen = {}
    original = trainers.MetricLossOnly.__init__

    def spy(self, models, optimizers, *args, **kwargs):
        seen.update(models=models, freeze=kwargs["freeze_trunk_batchnorm"])
        original(self, models, optimizers, *args, **kwargs)

    monkeypatch.setattr(trainers.MetricLossOnly, "__init__", spy)
    config = tiny_config(folder, tmp_path, backbone="efficientnet-lite0-partial", losses=("ProxyAnchor",))
    config.seeds = 1
    run_bench(config)
    assert seen["freeze"]

    # the cache holds the pretrained frozen layers' outputs of the clean images
    data = load_image_folder(folder, 32)
    (cache_folder,) = (tmp_path / "cache" / "features").glob(f"*-lite0-cut{backbones.PARTIAL_CUT}-v*[0-9]")
    view0 = np.load(cache_folder / "view0.npy")
    frozen = Lite0Layers(32, 0, backbones.PARTIAL_CUT).eval()
    with torch.no_grad():
        expected = frozen(collate_eval_images([(torch.from_numpy(i), 0) for i in data.images])[0])
    np.testing.assert_allclose(view0, expected.numpy(), rtol=1e-5, atol=1e-5)
    digests = {path.name: digest(path) for path in cache_folder.glob("view*.npy")}

    # the layers after the cut trained; BatchNorm kept its ImageNet statistics
    (run_dir,) = (tmp_path / "out").glob("*/runs/ProxyAnchor/seed0")
    (trunk_file,) = (run_dir / "models").glob("trunk_best*.pth")
    trained = torch.load(trunk_file, map_location="cpu")
    pretrained = backbones.build_trunk(config.backbone, 32).state_dict()
    changed = [k for k, v in pretrained.items() if not torch.equal(trained[f"0.{k}"], v)]
    assert any(k.endswith("weight") and "_bn" not in k and "head.1" not in k for k in changed)
    assert not [k for k in changed if "running_" in k or "num_batches" in k]

    # the saved models give back the run's test embeddings
    split = make_split(data, config.val_fraction)
    trunk = torch.nn.Sequential(
        backbones.build_trunk(config.backbone, 32), backbones.Standardize(torch.zeros(2, 3888))
    )
    trunk.load_state_dict(trained)
    embedder = catalog.get_entry("ProxyAnchor").make_embedder(3888, config.embedding_size)
    (embedder_file,) = (run_dir / "models").glob("embedder_best*.pth")
    embedder.load_state_dict(torch.load(embedder_file, map_location="cpu"))
    with torch.no_grad():
        embeddings = embedder(trunk.eval()(torch.from_numpy(view0[split.test])))
    saved = np.load(run_dir / "test_embeddings.npz")
    np.testing.assert_array_equal(saved["labels"], split.test_labels)
    np.testing.assert_allclose(
        saved["embeddings"], torch.nn.functional.normalize(embeddings).numpy(), atol=2e-3, rtol=0
    )

    # a second invocation with another seed reads the first run back and leaves the cache
    capsys.readouterr()
    config.seeds = 2
    rows = run_bench(config)
    assert "resuming: 2 of 3 runs already finished" in capsys.readouterr().err
    assert [r["loss"] for r in rows] == ["(no training)", "ProxyAnchor"]
    assert {path.name: digest(path) for path in cache_folder.glob("view*.npy")} == digests


def test_the_cut_choosing_script_trains_each_setting(folder, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setattr(backbones, "BACKBONES", dict(backbones.BACKBONES))  # it registers its cuts there
    path = Path(__file__).parents[1] / "scripts" / "choose_trunk_cut.py"
    spec = importlib.util.spec_from_file_location("choose_trunk_cut", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = ["--settings", "17:0.1", "--losses", "ProxyAnchor", "--data", str(folder), "--image-size", "32"]
    argv += [
        "--epochs",
        "1",
        "--workers",
        "1",
        "--out",
        str(tmp_path / "out"),
        "--cache",
        str(tmp_path / "cache"),
    ]
    script.main(argv)
    printed = capsys.readouterr().out
    assert "17   0.1    0    ProxyAnchor" in printed and "# cut 17, lr x 0.1, warm-up 0:" in printed
    with pytest.raises(SystemExit):
        script.main(["--settings", "16"])


def warmup_run(trunk_warmup_epochs, epochs, frozen_trunk=False):
    """A small MetricLossOnly run of the bench's trainer: a Linear trunk and embedder,
    ProxyAnchor; returns (trunk, embedder, loss, trunk clipper) after ``epochs``."""
    torch.manual_seed(0)
    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(64) % 4
    trunk, embedder = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
    loss = losses.ProxyAnchorLoss(4, 4)
    models = {"trunk": trunk, "embedder": embedder, "metric_loss": loss}
    if frozen_trunk:
        trunk.requires_grad_(False)
    config = BenchConfig(grad_clip=10)
    optimizers, schedulers, clippers = bench_run.optimisation(models, config, 0.1)
    trainer = bench_run.MetricLossOnly(
        {"trunk": trunk, "embedder": embedder},
        optimizers,
        16,
        {"metric_loss": loss},
        torch.utils.data.TensorDataset(data, labels),
        sampler=torch.utils.data.SequentialSampler(range(64)),
        dataloader_num_workers=0,  # as the bench's runs (PML's default starts 2 worker processes)
        data_device=torch.device("cpu"),
        lr_schedulers=schedulers,
        gradient_clippers={f"{name}_grad_clipper": c for name, c in clippers.items()},
        trunk_warmup_epochs=trunk_warmup_epochs,
    )
    trainer.train(num_epochs=epochs)
    return trunk, embedder, loss, clippers.get("trunk")


def test_the_trunk_is_frozen_during_its_warmup_epochs_and_trains_after():
    torch.manual_seed(0)
    pretrained = torch.nn.Linear(8, 8).state_dict()
    trunk, embedder, loss, clipper = warmup_run(trunk_warmup_epochs=2, epochs=2)
    assert all(torch.equal(v, pretrained[k]) for k, v in trunk.state_dict().items())
    assert clipper.steps == 0  # nothing to clip while frozen
    # a warm-up epoch is an epoch of the frozen trunk: the embedder and proxies are the same
    _, frozen_embedder, frozen_loss, _ = warmup_run(trunk_warmup_epochs=0, epochs=2, frozen_trunk=True)
    assert torch.equal(embedder.weight, frozen_embedder.weight)
    assert torch.equal(loss.proxies, frozen_loss.proxies)
    # then the trunk trains
    trunk, *_, clipper = warmup_run(trunk_warmup_epochs=2, epochs=3)
    assert not torch.equal(trunk.weight, pretrained["weight"])
    assert all(p.requires_grad for p in trunk.parameters())
    assert clipper.steps == 4  # the third epoch's four batches
    trunk, *_ = warmup_run(trunk_warmup_epochs=0, epochs=1)
    assert not torch.equal(trunk.weight, pretrained["weight"])  # no warm-up: it trains at once
