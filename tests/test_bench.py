"""The bench pipeline end to end on a tiny synthetic image folder (seconds), resume,
label noise, the class split, the CLI."""

import csv
import dataclasses
import json

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw
from pytorch_metric_learning import trainers

from pml_fieldlosses.app import catalog as registry
from pml_fieldlosses.app import cli
from pml_fieldlosses.app.backbones import SmallConvNet, Standardize, build_trunk, get_backbone
from pml_fieldlosses.app.bench import BenchConfig, quick_config, run_bench, runs, selection
from pml_fieldlosses.app.bench import features as bench_features
from pml_fieldlosses.app.bench import run as bench_run
from pml_fieldlosses.app.bench.protocol import corrupt_labels, make_split, training_labels
from pml_fieldlosses.app.datasets import ImageSet, load_image_folder
from pml_fieldlosses.app.datasets.augment import augment, random_affine

from .helpers import DEVICE

NUM_CLASSES, PER_CLASS = 12, 4


def make_folder(root, size=24):
    """12 classes of coloured shapes (4 variants each: position and scale jitter)."""
    rng = np.random.default_rng(0)
    for c in range(NUM_CLASSES):
        folder = root / f"shape_{c:02d}"
        folder.mkdir(parents=True)
        colour = tuple(int(v) for v in rng.integers(30, 230, 3))
        for i in range(PER_CLASS):
            image = Image.new("RGB", (size, size), "white")
            draw = ImageDraw.Draw(image)
            r = size // 4 + i % 2
            x, y = size // 2 + (i - 1.5), size // 2 + (1.5 - i)
            box = [x - r, y - r, x + r, y + r]
            [draw.ellipse, draw.rectangle, draw.pieslice][c % 3](
                box, fill=colour, **({"start": 0, "end": 270} if c % 3 == 2 else {})
            )
            image.save(folder / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("data") / "shapes")


def tiny_config(folder, tmp_path, **overrides):
    settings = dict(
        data=str(folder),
        image_size=32,
        embedding_size=16,
        seeds=2,
        epochs=2,
        patience=1,
        aug_views=1,
        workers=1,
        out=str(tmp_path / "out"),
        cache=str(tmp_path / "cache"),
    )
    settings.update(overrides)
    return BenchConfig(**settings)


def result_files(out):
    return sorted(p.relative_to(out).as_posix() for p in out.glob("*/runs/*/seed*/result.json"))


def test_bench_end_to_end_writes_report_and_resumes(folder, tmp_path, capsys, monkeypatch):
    config = tiny_config(folder, tmp_path)
    rows = run_bench(config)
    printed = capsys.readouterr().out
    names = [runs.UNTRAINED, *registry.LOSSES]
    assert sorted(r["loss"] for r in rows) == sorted(names)
    for name in names:
        assert name in printed
    assert "wall time:" in printed and "MAP@R" in printed
    out = next((tmp_path / "out").iterdir())
    for name in [
        "README.md",
        "results.csv",
        "summary.json",
        "learning_curves.png",
        "time_per_epoch.png",
        "retrieval_grid.png",
        "embedding_map.png",
    ]:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    with open(out / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["loss"] for r in table] == [r["loss"] for r in rows]
    for row in table:
        assert 0 <= float(row["mean_average_precision_at_r"]) <= 1
        assert int(row["seeds"]) == 2
    assert "| ProxyAnchor |" in (out / "README.md").read_text()
    # record-keeper records, tensorboard logs, the selected model
    pa = out / "runs" / "ProxyAnchor" / "seed0"
    assert list((pa / "records").glob("*VAL_vs_self.csv")) and (pa / "records" / "logs.db").is_file()
    assert list((out / "tensorboard" / "ProxyAnchor" / "seed1").glob("events.out.tfevents.*"))
    result = json.loads((pa / "result.json").read_text())
    assert list((pa / "models").glob(f"embedder_best{result['best_epoch']}.pth"))
    assert 1 <= result["best_epoch"] <= result["epochs_run"] <= 2
    assert len(result["val_history"]["epoch"]) == result["epochs_run"]

    # a rerun finds every result and trains nothing
    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was recomputed")

    monkeypatch.setattr(runs, "train_one", no_training)
    again = run_bench(config)
    assert [r["mean_average_precision_at_r"] for r in again] == [
        r["mean_average_precision_at_r"] for r in rows
    ]
    assert "resuming: " in capsys.readouterr().err

    # a killed run (folder without result.json) is redone, and only it
    killed = out / "runs" / "MFCWMS" / "seed1"
    (killed / "result.json").unlink()
    calls = []
    finished = runs.RunResult.read(out / "runs" / "MFCWMS" / "seed0" / "result.json")

    def record_call(name, seed, *args, **kwargs):
        calls.append((name, seed))
        return dataclasses.replace(finished, seed=seed)

    monkeypatch.setattr(runs, "train_one", record_call)
    run_bench(config)
    assert calls == [("MFCWMS", 1)]
    assert (killed / "result.json").is_file()


@pytest.mark.parametrize(
    "backbone", ["efficientnet-lite0", "efficientnet-lite0-partial", "efficientnet-lite0-finetune", "convnet"]
)
def test_every_loss_trains_and_is_evaluated_on_the_test_device(folder, tmp_path, backbone):
    """The bench's --device: models, batches, the untrained row and every evaluation on
    TEST_DEVICE (TEST_DEVICE=cuda runs the bench on a GPU), for every backbone."""
    config = tiny_config(folder, tmp_path, backbone=backbone, device=str(DEVICE), seeds=1, epochs=1)
    rows = run_bench(config)
    assert sorted(r["loss"] for r in rows) == sorted([runs.UNTRAINED, *registry.LOSSES])
    for row in rows:
        assert 0 <= row["mean_average_precision_at_r"] <= 1, row["loss"]


def test_other_settings_do_not_mix_into_a_results_folder(folder, tmp_path):
    config = tiny_config(folder, tmp_path, losses=("ProxyAnchor",), seeds=1, epochs=1, workers=2)
    run_bench(config)
    out = next((tmp_path / "out").iterdir())
    protocol = json.loads((out / "protocol.json").read_text())
    protocol["data_fingerprint"] = "something else"
    (out / "protocol.json").write_text(json.dumps(protocol))
    with pytest.raises(RuntimeError, match="other settings or other data"):
        run_bench(config)
    # settings that change results get their own folder
    assert tiny_config(folder, tmp_path, label_noise=0.2).folder_name() != config.folder_name()
    same = tiny_config(folder, tmp_path, seeds=5, losses=("CWMS",), epochs=1, workers=1)
    assert same.folder_name() == config.folder_name()


def test_label_noise_changes_exactly_that_fraction_of_training_labels_only(folder, tmp_path, monkeypatch):
    seen = []
    original = bench_features.Inputs.train_dataset

    def spy(self, labels):
        seen.append((self.split, np.array(labels)))
        return original(self, labels)

    monkeypatch.setattr(bench_features.Inputs, "train_dataset", spy)
    config = tiny_config(folder, tmp_path, losses=("ProxyAnchor", "CWMS"), label_noise=0.25, epochs=1)
    rows = run_bench(config)
    assert len(seen) == 4  # 2 losses x 2 seeds
    clean = make_split(load_image_folder(folder, 32), config.val_fraction)
    for split, labels in seen:
        n = len(split.train_labels)
        changed = np.flatnonzero(labels != split.train_labels)
        assert len(changed) == round(0.25 * n)
        assert labels.min() >= 0 and labels.max() < split.num_train_classes
        # validation and test labels (what model selection and the table use) are the clean ones
        np.testing.assert_array_equal(split.val_labels, clean.val_labels)
        np.testing.assert_array_equal(split.test_labels, clean.test_labels)
        np.testing.assert_array_equal(split.train_labels, clean.train_labels)
    # runs go seed-major: same seed, same corruption for every loss; another seed, another one
    by_seed = {}
    for (_, labels), seed in zip(seen, [s for s in range(2) for _ in config.losses]):
        by_seed.setdefault(seed, []).append(labels)
    for variants in by_seed.values():
        np.testing.assert_array_equal(variants[0], variants[1])
    assert not np.array_equal(by_seed[0][0], by_seed[1][0])
    out = next((tmp_path / "out").iterdir())
    result = json.loads((out / "runs" / "CWMS" / "seed0" / "result.json").read_text())
    assert result["label_noise"] == {
        "fraction": 0.25,
        "changed": round(0.25 * len(clean.train)),
        "of": len(clean.train),
    }
    assert "noise0.25" in out.name and rows


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.2, 0.5, 0.9])
@pytest.mark.parametrize("n", [1, 7, 100, 1001])
def test_corrupt_labels_exact_count(fraction, n):
    rng = np.random.default_rng(n)
    labels = rng.integers(0, 5, n)
    noisy, changed = corrupt_labels(labels, fraction, 5, seed=3)
    assert len(changed) == round(fraction * n) == int((noisy != labels).sum())
    assert (noisy[changed] != labels[changed]).all()
    assert noisy.min() >= 0 and noisy.max() < 5
    again, _ = corrupt_labels(labels, fraction, 5, seed=3)
    np.testing.assert_array_equal(noisy, again)
    assert noisy is not labels


def test_corrupt_labels_rejects_bad_fractions():
    with pytest.raises(ValueError, match="fraction"):
        corrupt_labels([0, 1], 1.0, 2, 0)
    with pytest.raises(ValueError, match="2 classes"):
        corrupt_labels([0, 0], 0.5, 1, 0)


def synthetic_set(num_classes=40, per_class=3):
    labels = np.repeat(np.arange(num_classes), per_class)
    return ImageSet(
        images=np.zeros((len(labels), 4, 4, 3), dtype=np.uint8),
        labels=labels,
        class_names=[str(c) for c in range(num_classes)],
        sources=["x"] * len(labels),
        num_train_classes=num_classes // 2,
    )


def test_split_carves_validation_from_training_classes_only():
    data = synthetic_set()
    split = make_split(data, 0.2)
    train_classes = set(data.labels[split.train])
    val_classes = set(data.labels[split.val])
    test_classes = set(data.labels[split.test])
    assert len(val_classes) == 4 and not train_classes & val_classes
    assert train_classes | val_classes == set(range(20)) and test_classes == set(range(20, 40))
    assert sorted(np.concatenate([split.train, split.val, split.test])) == list(range(len(data.labels)))
    assert split.num_train_classes == 16 and set(split.train_labels) == set(range(16))
    noisy, changed = training_labels(split, 0.5, seed=1)
    assert len(changed) == round(0.5 * len(split.train)) and split.train_labels is not noisy
    with pytest.raises(ValueError, match="at least 8 classes"):
        make_split(synthetic_set(6), 0.2)


def test_cli_runs_the_bench_in_parallel_workers_and_reports_errors(folder, tmp_path, capsys):
    argv = ["bench", "--data", str(folder), "--backbone", "convnet", "--image-size", "16"]
    argv += ["--losses", "ProxyAnchor,MultiSimilarity", "--seeds", "1", "--epochs", "1", "--workers", "2"]
    argv += ["--embedding-size", "8", "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "MultiSimilarity" in out and runs.UNTRAINED in out and "wall time:" in out
    assert len(result_files(tmp_path / "out")) == 3

    assert cli.main(["bench", "--losses", "NoSuchLoss", "--out", str(tmp_path / "x")]) == 2
    assert "unknown loss 'NoSuchLoss'" in capsys.readouterr().err
    assert cli.main(["bench", "--label-noise", "1.5", "--out", str(tmp_path / "x")]) == 2
    assert "--label-noise" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "--backbone", "resnet"])


def test_quick_config_keeps_explicit_options():
    config = quick_config(seeds=4)
    assert config.quick and config.seeds == 4 and config.epochs < BenchConfig().epochs
    assert set(registry.default_losses()) >= {"ProxyAnchor", "MultiSimilarity", "MFCont", "CWMS", "MFCWMS"}


def test_augment_is_seeded_and_fills_white():
    images = torch.full((3, 3, 16, 16), 255.0)
    moved = random_affine(images, torch.Generator().manual_seed(0))
    torch.testing.assert_close(moved, images)  # white stays white, the border fills white
    x = torch.rand(4, 3, 16, 16) * 255
    a = augment(x, torch.Generator().manual_seed(1))
    b = augment(x, torch.Generator().manual_seed(1))
    torch.testing.assert_close(a, b)
    assert a.min() >= 0 and a.max() <= 255 and not torch.allclose(a, x)


def test_standardize_weighs_each_block_alike():
    features = torch.randn(500, 6, dtype=torch.float64) * torch.tensor([1.0, 2, 3, 4, 5, 6]) + 7
    out = Standardize(features, [2, 4])(features)
    torch.testing.assert_close(out.mean(0), torch.zeros(6, dtype=torch.float64), atol=1e-9, rtol=0)
    expected = torch.tensor([2**-0.5] * 2 + [0.5] * 4, dtype=torch.float64)
    torch.testing.assert_close(out.std(0), expected)
    with pytest.raises(ValueError, match="block_sizes"):
        Standardize(features, [2, 3])


def test_feature_views_do_not_depend_on_the_number_of_workers(folder, monkeypatch):
    data = load_image_folder(folder, 32)
    monkeypatch.setattr(bench_features, "CHUNK", 10)
    trunk = SmallConvNet().eval()
    rows = {0: np.arange(len(data.images)), 1: np.arange(0, len(data.images), 2), 2: np.arange(5, 30)}
    one = bench_features.compute_views(trunk, data.images, rows, torch.device("cpu"), workers=1)
    two = bench_features.compute_views(trunk, data.images, rows, torch.device("cpu"), workers=2)
    for view in rows:
        assert one[view].shape == (len(rows[view]), trunk.out_features)
        np.testing.assert_allclose(one[view], two[view], rtol=1e-5, atol=1e-5)
    assert not np.allclose(one[1], one[0][rows[1]])  # augmented views differ from the clean one


def test_finetuned_trunk_is_trained_with_its_own_lower_lr(folder, tmp_path, monkeypatch):
    seen = {}
    original = trainers.MetricLossOnly.__init__

    def spy(self, models, optimizers, *args, **kwargs):
        seen.update(models=models, optimizers=optimizers)
        original(self, models, optimizers, *args, **kwargs)

    monkeypatch.setattr(trainers.MetricLossOnly, "__init__", spy)
    trained_models = []
    original_train = bench_run.MetricLossOnly.train

    def train(self, *args, **kwargs):  # the trunk as training left it (before the best epoch is loaded)
        original_train(self, *args, **kwargs)
        trained_models.append({k: v.clone() for k, v in self.models["trunk"][0].state_dict().items()})

    monkeypatch.setattr(bench_run.MetricLossOnly, "train", train)
    config = tiny_config(folder, tmp_path, backbone="efficientnet-lite0-finetune", losses=("ProxyAnchor",))
    config.seeds, config.epochs = 1, 2  # its first epoch is the trunk's warm-up
    rows = run_bench(config)
    assert [r["loss"] for r in rows] == [runs.UNTRAINED, "ProxyAnchor"]
    lrs = {name: opt.param_groups[0]["lr"] for name, opt in seen["optimizers"].items()}
    assert lrs["trunk_optimizer"] == pytest.approx(
        config.lr * get_backbone(config.backbone).trunk_lr_multiplier
    )
    assert lrs["metric_loss_optimizer"] == pytest.approx(config.lr * config.loss_lr_multiplier)
    assert lrs["embedder_optimizer"] == pytest.approx(config.lr)
    pretrained = build_trunk(config.backbone, 32).state_dict()
    (trained,) = trained_models  # the trained part, then the fixed Standardize
    assert not torch.equal(trained["stem.0.weight"], pretrained["stem.0.weight"])
    statistics = [k for k in pretrained if "running_" in k]  # BatchNorm keeps ImageNet's (frozen)
    assert statistics and all(torch.equal(trained[k], pretrained[k]) for k in statistics)


def test_a_name_can_set_the_tuned_hyperparameter():
    entry = registry.get_entry("PFML[delta=0.3]")
    assert entry.name == "PFML[delta=0.3]" and entry.tuned == "delta" and entry.value == 0.3
    assert entry.build(10, 16).delta == 0.3
    assert registry.get_entry("PFML").value == registry.hyperparameters()["PFML"]["delta"]
    with pytest.raises(ValueError, match=r"takes \[delta=VALUE\]"):
        registry.get_entry("PFML[margin=0.3]")
    with pytest.raises(ValueError, match="is not a number"):
        registry.get_entry("PFML[delta=big]")
    with pytest.raises(ValueError, match=r"unknown loss 'Nope\[delta=0.3\]'"):
        registry.get_entry("Nope[delta=0.3]")
    for name, entry in registry.LOSSES.items():  # every entry builds, with its candidates
        assert entry.value in entry.grid and len(set(entry.grid)) == 3, name
        assert isinstance(entry.build(10, 16), torch.nn.Module), name


def test_selection_trains_every_candidate_never_tests_and_keeps_the_default_on_ties(
    folder, tmp_path, capsys, monkeypatch
):
    argv = ["select", "--data", str(folder), "--backbone", "convnet", "--image-size", "16"]
    argv += ["--losses", "ProxyAnchor,CWMS", "--epochs", "1", "--workers", "1", "--embedding-size", "8"]
    argv += ["--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| ProxyAnchor | margin |" in printed and "SELECTED = {" in printed
    assert "bench --losses 'ProxyAnchor[margin=" in printed
    out = next((tmp_path / "out").iterdir())
    assert "-selection-" in out.name
    assert "hyperparameters" not in json.loads((out / "protocol.json").read_text())
    found = result_files(tmp_path / "out")
    assert len(found) == 6 and all("seed1000" in path for path in found)
    for path in found:
        result = json.loads((tmp_path / "out" / path).read_text())
        assert result["test"] is None and 0 <= result["best_val_map_at_r"] <= 1
    assert not list(out.glob("runs/*/seed*/test_embeddings.npz"))
    table = json.loads((out / "selection.json").read_text())
    assert [row[0] for row in table["CWMS"]] == list(registry.get_entry("CWMS").grid)

    assert selection.chosen({"A": [(1, 0.5, 3, 0), (2, 0.5, 3, 0), (3, 0.4, 3, 0)]}) == {"A": 1}
    assert selection.chosen({"A": [(1, 0.5, 3, 0), (2, 0.6, 3, 0), (3, 0.4, 3, 0)]}) == {"A": 2}
    with pytest.raises(ValueError, match=r"do not set it in the name \(PFML\[alpha=2,delta=0.3\]\)"):
        selection.select(tiny_config(folder, tmp_path, losses=("PFML[alpha=2,delta=0.3]",)))
    # other settings are kept: every candidate is a name the bench reads back
    (entry,) = selection.selectable_entries(["PFML[alpha=2]"])
    assert entry.candidates() == [f"PFML[alpha=2,delta={v:g}]" for v in entry.grid]
    assert [registry.get_entry(c).build(3, 4).alpha for c in entry.candidates()] == [2] * len(entry.grid)
    assert selection.selectable_entries(["PFML[repulsion_delta=0.6]"])[0].tuned == "delta"


def test_report_names_few_sources_and_counts_many():
    """emoji's vendors and the icons' sets by name; the glyphs' hundreds of fonts by number."""
    from types import SimpleNamespace

    from pml_fieldlosses.app.bench.benchmark import MAX_NAMED_SOURCES, describe

    few = SimpleNamespace(sources=["twemoji", "noto", "twemoji"])
    assert describe(BenchConfig(data="emoji"), few) == "multi-vendor emoji (noto, twemoji)"
    many = SimpleNamespace(sources=[f"font-{i}" for i in range(MAX_NAMED_SOURCES + 1)])
    assert (
        describe(BenchConfig(data="glyphs"), many)
        == f"letters of many typefaces ({MAX_NAMED_SOURCES + 1} sources)"
    )
    assert describe(BenchConfig(data="some/folder"), many) == "image folder some/folder"
