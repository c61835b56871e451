"""Every config we ship composes as pb's own (``--config_<folder> [default, X]``), survives
pb's save and reload (yaml.dump, then safe_load) with every trunk we ship, and the
launcher refuses unknown config options and names in one line (exit 2)."""

import subprocess
import sys
from pathlib import Path

import pytest

from .pb_support import pb_skip

MISSING, pytestmark = pb_skip("powerful_benchmarker", "torchvision")
if not MISSING:
    import yaml
    from easy_module_attribute_getter import utils as emag_utils
    from powerful_benchmarker.runners.single_experiment_runner import SingleExperimentRunner
    from powerful_benchmarker.utils import common_functions as pb_c_f

    from pml_fieldlosses.app.benchmarker import compat, launcher, registration, synthetic, trunks

CONFIG_ROOT = Path(__file__).resolve().parents[1] / "configs"
KEYWORDS = ("~OVERRIDE~", "~APPLY~", "~SWAP~", "~DELETE~", "~BAYESIAN~", "~LOG_BAYESIAN~", "~INT_BAYESIAN~")
# dicts whose keys are transform classes applied in sequence (all others name one class)
SEQUENCES = ("train", "eval")


def folders():
    return yaml.safe_load((CONFIG_ROOT / "config_foldernames.yaml").read_text())["config_foldernames"]


def override_files():
    return [
        (folder, path.stem)
        for folder in folders()
        for path in sorted((CONFIG_ROOT / folder).glob("*.yaml"))
        if path.stem != "default"
    ]


def load(folder, name):
    return yaml.safe_load((CONFIG_ROOT / folder / f"{name}.yaml").read_text()) or {}


def merge(folder, names):
    """pb's merge (YamlReader.load_yamls: merge_two_dicts, max_merge_depth=inf)."""
    config = {}
    for name in names:
        config = emag_utils.merge_two_dicts(config, load(folder, name), max_merge_depth=float("inf"))
    return config


def strip(key):
    for keyword in KEYWORDS:
        key = key.split(keyword)[0]
    return key


def class_specs(config, path=()):
    """(path, class names) of every ``{ClassName: params}`` slot in a config."""
    for key, value in config.items():
        if not isinstance(value, dict) or not value:
            continue
        if all(k[:1].isupper() for k in value) and strip(key) not in SEQUENCES:
            yield path + (strip(key),), sorted(strip(k) for k in value)
        else:
            yield from class_specs(value, path + (strip(key),))


@pytest.mark.parametrize("folder,name", [] if MISSING else override_files(), ids=lambda v: str(v))
def test_every_config_composes_after_default(folder, name):
    merged = merge(folder, ["default", name])
    for path, names in class_specs(merged):
        assert len(names) == 1, f"[default, {name}] in {folder}: {'/'.join(path)} holds {names}"
    # the file's own classes win
    merged_specs = dict(class_specs(merged))
    for path, names in class_specs(load(folder, name)):
        assert merged_specs[path] == names, (folder, name, path)


def test_a_misshapen_override_is_caught():
    """The test above catches the shape pb refuses ("too many values to unpack")."""
    merged = emag_utils.merge_two_dicts(
        {"dataset": {"CUB200": None}},
        {"dataset": {"Emoji": {"image_size": 64}}},
        max_merge_depth=float("inf"),
    )
    assert [names for _, names in class_specs(merged)] == [["CUB200", "Emoji"]]


RECIPE_OPTIMIZERS = sorted(
    path.stem for path in (CONFIG_ROOT / "config_optimizers").glob("emoji_features_*.yaml")
)
RECIPE_DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarker.md"


@pytest.mark.parametrize("name", RECIPE_OPTIMIZERS)
def test_recipe_optimizers_compose_after_emoji_features(name):
    """A loss's CPU-recipe optimisers, in the documented form [default, emoji_features, X]: one
    class per optimiser, Adam as the recipe's embedder, no trunk optimiser (the trunk passes
    cached features on), a metric_loss_optimizer for the loss's parameters; and the recipe's
    section of docs/benchmarker.md names the file."""
    optimizers = merge("config_optimizers", ["default", "emoji_features", name])["optimizers"]
    specs = dict(class_specs(optimizers))
    assert specs == {("embedder_optimizer",): ["Adam"], ("metric_loss_optimizer",): ["Adam"]}, (name, specs)
    assert all(spec["Adam"]["lr"] > 0 for spec in optimizers.values())
    recipe = RECIPE_DOCS.read_text().split("## A run that trains on a CPU")[1].split("\n## ")[0]
    assert f"[default, emoji_features, {name}]" in recipe, name


def roundtrip(config, tmp_path):
    path = tmp_path / "config.yaml"
    pb_c_f.write_yaml(str(path), config, open_as="w")
    return pb_c_f.load_yaml(str(path))


@pytest.fixture(scope="module")
def getter():
    compat.restore_identity_in_pml()
    return registration.register(SingleExperimentRunner(root_config_folder=str(CONFIG_ROOT))).pytorch_getter


# every trunk we ship (none to list where pb is not installed: the module is skipped)
TRUNKS = (
    []
    if MISSING
    else [trunks.SmallConvNet, trunks.EfficientNetLite0, synthetic.TinyConvNet, trunks.PixelRangeInput]
)


def test_every_config_survives_pbs_save_and_reload(getter, tmp_path):
    """[default], [default, X] and [default, every file] of each folder, after the
    transform factory ran with each trunk we ship (pb's getter writes the trunk's
    mean/std into the config)."""
    factory = compat.TransformFactory(getter=getter)
    for folder in folders():
        names = sorted(p.stem for p in (CONFIG_ROOT / folder).glob("*.yaml") if p.stem != "default")
        for pair in [["default"]] + [["default", n] for n in names] + [["default", *names]]:
            config = merge(folder, pair)
            if folder == "config_transforms":
                for trunk in TRUNKS:
                    factory.create(named_specs=config["transforms"], kwargs={"trunk_model": trunk})
            assert roundtrip(config, tmp_path) == config, (folder, pair)
    for trunk in TRUNKS:
        properties = {
            k: getattr(trunk, k) for k in ("mean", "std", "input_space", "input_range") if hasattr(trunk, k)
        }
        assert roundtrip(properties, tmp_path) == properties, trunk


def test_transform_factory_transforms_written_into_config(getter, tmp_path):
    class TupleTrunk:
        mean, std, input_space, input_range = (0.5, 0.5, 0.5), (0.2, 0.2, 0.2), "RGB", (0, 1)

    spec = {"train": {"Resize": {"size": 8}}}
    compat.TransformFactory(getter=getter).create(named_specs=spec, kwargs={"trunk_model": TupleTrunk()})
    assert spec == {"train": {"Resize": {"size": 8}}} and roundtrip(spec, tmp_path) == spec
    from powerful_benchmarker import factories as pb_factories

    pb_factories.TransformFactory(getter=getter).create(
        named_specs=spec, kwargs={"trunk_model": TupleTrunk()}
    )
    with pytest.raises(yaml.constructor.ConstructorError):  # pb's own factory: the defect
        roundtrip(spec, tmp_path)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--config_model", "[tiny]"], "unknown option --config_model"),
        (["--config_models", "[tinny]"], "no config named 'tinny'"),
        (["--config_dataset", "[default,", "emoj]"], "no config named 'emoj'"),
        (["--config_eval"], "--config_eval needs config names"),
        (["--register", "loss"], "--register expects KIND=TARGET"),
        (["--register", "loss=no_such_module_here"], "No module named"),
    ],
)
def test_usage_errors_are_one_line(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        launcher.main(["--root_experiment_folder", str(tmp_path), "--experiment_name", "x", *args])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not any(tmp_path.iterdir())


def test_usage_error_exit_code_from_the_command_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pml_fieldlosses.app.benchmarker", "--root_experiment_folder", str(tmp_path),
         "--experiment_name", "x", "--config_model", "[tiny]"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "pml-fieldlosses-pb: error: unknown option --config_model"
    ), lines


def test_experiment_folder_taken_exits_0(tmp_path):
    """pb logs "Experiment folder already taken!" at INFO and exits with 0."""
    (tmp_path / "x" / "some_folder").mkdir(parents=True)
    (tmp_path / "x" / "some_folder" / "file").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "pml_fieldlosses.app.benchmarker", "--root_experiment_folder", str(tmp_path),
         "--experiment_name", "x", "--config_dataset", "[default,", "synthetic]", "--config_models",
         "[default,", "tiny]", "--config_transforms", "[default,", "small]"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pml-fieldlosses-pb: error: the experiment folder is already taken"), last
