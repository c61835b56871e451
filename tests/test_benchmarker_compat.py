"""One test per shim of pml_fieldlosses.app.benchmarker.compat: the shim fixes what it is named
after, and (where the old behaviour can still be produced) the unshimmed PML 2 /
record-keeper / pb code fails in the way the shim exists for."""

import datetime
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing

import pytest

from .pb_support import pb_skip

MISSING, pytestmark = pb_skip("powerful_benchmarker", "torchvision")
if not MISSING:
    import torch
    from powerful_benchmarker import factories as pb_factories
    from powerful_benchmarker.runners.single_experiment_runner import SingleExperimentRunner
    from powerful_benchmarker.utils import common_functions as pb_c_f
    from pytorch_metric_learning import losses as pml_losses
    from pytorch_metric_learning import testers
    from pytorch_metric_learning.utils import common_functions as pml_c_f
    from pytorch_metric_learning.utils import logging_presets
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    from pml_fieldlosses.app.benchmarker import compat, files, launcher, records, registration
    from pml_fieldlosses.app.errors import FileFault

MAP_R = "mean_average_precision_at_r"


@pytest.fixture(scope="module")
def getter():
    """A pb runner's class lookup with our registrations."""
    compat.restore_identity_in_pml()
    runner = SingleExperimentRunner(root_config_folder=launcher.default_config_root())
    return registration.register(runner).pytorch_getter


def make_tester():
    calculator = AccuracyCalculator(include=(MAP_R,), k="max_bin_count", device=torch.device("cpu"))
    return testers.GlobalEmbeddingSpaceTester(
        accuracy_calculator=calculator, dataloader_num_workers=0, data_device=torch.device("cpu")
    )


def make_dataset_dict():
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(4).repeat_interleave(5)
    embeddings = torch.randn(20, 8, generator=generator) + 3 * torch.nn.functional.one_hot(labels, 8)
    return {"val": torch.utils.data.TensorDataset(embeddings, labels)}


def table_rows(folder, table):
    with closing(sqlite3.connect(folder / "logs.db")) as connection:
        connection.row_factory = sqlite3.Row
        return [dict(r) for r in connection.execute(f"SELECT * FROM {table}")]


def legacy_keeper(folder):
    return records.get_legacy_record_keeper(csv_folder=str(folder))


def test_restore_identity_in_pml(monkeypatch):
    monkeypatch.delattr(pml_c_f, "Identity", raising=False)
    with pytest.raises(AttributeError, match="Identity"):
        SingleExperimentRunner(root_config_folder=launcher.default_config_root())
    compat.restore_identity_in_pml()
    assert pml_c_f.Identity is torch.nn.Identity
    runner = SingleExperimentRunner(root_config_folder=launcher.default_config_root())
    assert isinstance(runner.pytorch_getter.get("model", class_name="Identity"), torch.nn.Identity)


def test_get_record_keeper_without_save_figures(tmp_path):
    with pytest.raises(TypeError, match="save_figures"):
        logging_presets.get_record_keeper(csv_folder=str(tmp_path / "a"), save_figures=False)
    keeper = records.get_legacy_record_keeper(csv_folder=str(tmp_path / "b"), save_figures=False)
    assert isinstance(keeper, records.LegacyRecordKeeper)
    factory = records.RecordKeeperFactory(getter=None)
    assert isinstance(
        factory.create({"csv_folder": str(tmp_path / "c"), "save_figures": True}), records.LegacyRecordKeeper
    )


def test_legacy_record_keeper_group_name_keyword_renamed(tmp_path):
    plain, _, _ = logging_presets.get_record_keeper(csv_folder=str(tmp_path / "plain"))
    with pytest.raises(TypeError, match="input_group_name_for_non_objects"):
        plain.update_records({"a": 1.0}, 1, input_group_name_for_non_objects="records")
    keeper = legacy_keeper(tmp_path / "legacy")
    keeper.update_records({"a": 1.0, "b": "x"}, 1, input_group_name_for_non_objects="records")
    keeper.save_records()
    assert table_rows(tmp_path / "legacy", "records") == [{"id": 1, "~iteration~": 1, "a": 1.0, "b": "x"}]


def test_legacy_record_keeper_timestamps_dropped(tmp_path):
    when = datetime.datetime(2020, 8, 9, 0, 44, 30)
    plain, _, _ = logging_presets.get_record_keeper(csv_folder=str(tmp_path / "plain"))
    plain.update_records({"a": 1.0, "timestamp": when}, 1, parent_name="records")
    plain.save_records()
    assert "timestamp" not in table_rows(tmp_path / "plain", "records")[0]
    keeper = legacy_keeper(tmp_path / "legacy")
    keeper.update_records({"a": 1.0, "timestamp": when}, 1, parent_name="records")
    keeper.save_records()
    assert table_rows(tmp_path / "legacy", "records")[0]["timestamp"] == "2020-08-09 00:44:30"


def test_legacy_record_keeper_record_names_hashed(tmp_path):
    # pb's aggregator table for a tester with pca: the part between the first and last
    # "_" is longer than 64 characters
    name = "MeanAggregator_accuracies_pca64_normalized_GlobalEmbeddingSpaceTester_level_0_VAL_vs_self"
    plain, _, _ = logging_presets.get_record_keeper(csv_folder=str(tmp_path / "plain"))
    plain.update_records({"a": 1.0}, 1, parent_name=name)
    plain.save_records()
    assert not plain.table_exists(name)
    keeper = legacy_keeper(tmp_path / "legacy")
    keeper.update_records({"a": 1.0}, 1, parent_name=name)
    keeper.save_records()
    assert keeper.query(f"SELECT a FROM {name}")[0]["a"] == 1.0
    assert (tmp_path / "legacy" / f"{name}.csv").is_file()


def test_record_keeper_csv_rows_of_interrupted_saves(tmp_path):
    # a run killed between record-keeper's CSV append and its database write leaves a CSV row
    # the database lacks; the resumed run writes that record again
    keeper = legacy_keeper(tmp_path)
    for epoch in [-1, 0]:
        keeper.update_records({"epoch": epoch, "map": 0.5}, epoch, parent_name="accuracies")
        keeper.save_records()
    csv_file = tmp_path / "accuracies.csv"
    completed = csv_file.read_text()
    with open(csv_file, "a") as f:
        f.write("1,1,0.25\n")  # the interrupted save: CSV only
    (tmp_path / "orphan.csv").write_text("~iteration~,x\n3,4\n")  # its table was never written
    _plain, _, _ = logging_presets.get_record_keeper(csv_folder=str(tmp_path))
    assert csv_file.read_text() != completed  # record-keeper alone keeps the stale row
    keeper = legacy_keeper(tmp_path)
    assert csv_file.read_text() == completed and not (tmp_path / "orphan.csv").exists()
    keeper.update_records({"epoch": 1, "map": 0.75}, 1, parent_name="accuracies")
    keeper.save_records()
    rows = [line.split(",") for line in csv_file.read_text().splitlines()[1:]]
    assert [row[1] for row in rows] == ["-1", "0", "1"] and rows[-1][2] == "0.75"
    assert len(table_rows(tmp_path, "accuracies")) == 3


def test_record_database_that_cannot_be_read_is_named(tmp_path):
    (tmp_path / "logs.db").write_bytes(b"not a database " * 64)
    with pytest.raises(sqlite3.DatabaseError):
        logging_presets.get_record_keeper(csv_folder=str(tmp_path))[0].record_writer.table_exists("x")
    with pytest.raises(FileFault, match=r"record database .*logs\.db cannot be read"):
        legacy_keeper(tmp_path)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="kills a process with SIGKILL")
def test_a_transaction_left_open_by_a_killed_process_is_rolled_back_not_named(tmp_path):
    """A run killed while it writes its records leaves a hot journal beside the database:
    the check rolls it back (as the next writer would) and the committed rows are all there;
    it is not a damaged database."""
    db = tmp_path / "logs.db"
    with closing(sqlite3.connect(db)) as connection:
        connection.execute("CREATE TABLE records (value)")
        connection.executemany("INSERT INTO records VALUES (?)", [(i,) for i in range(1000)])
        connection.commit()
    killed_while_writing = (
        "import os, signal, sqlite3\n"
        f"connection = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
        "connection.execute('PRAGMA cache_size = 1')\n"  # pages spill to the file: a journal first
        "connection.execute('BEGIN')\n"
        "connection.executemany('INSERT INTO records VALUES (?)', [(i,) for i in range(20000)])\n"
        "connection.execute('UPDATE records SET value = value + 1')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    assert subprocess.run([sys.executable, "-c", killed_while_writing]).returncode == -signal.SIGKILL
    assert (tmp_path / "logs.db-journal").exists()  # the hot journal
    files.check_database(db)
    assert not (tmp_path / "logs.db-journal").exists()
    with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as connection:
        assert connection.execute("SELECT COUNT(*), SUM(value) FROM records").fetchone() == (1000, 499500)


class Trainer:
    """What PML's HookContainer saves and loads: the trainer's dicts of modules."""

    def __init__(self):
        self.models = {"trunk": torch.nn.Linear(2, 2), "embedder": torch.nn.Linear(2, 2)}
        self.optimizers = {"trunk_optimizer": torch.optim.SGD(self.models["trunk"].parameters(), lr=0.1)}


def test_hook_container_checkpoints_written_in_place(tmp_path, monkeypatch):
    trainer, hooks = Trainer(), compat.HookContainer(None)
    hooks.save_models(trainer, str(tmp_path), 1)
    hooks.save_models(trainer, str(tmp_path), 2, prev_suffix=1)
    names = ["embedder_2.pth", "trunk_2.pth", "trunk_optimizer_2.pth"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # the same files as PML's, no temporary left
    assert torch.equal(torch.load(tmp_path / "trunk_2.pth")["weight"], trainer.models["trunk"].weight)

    def disk_full(obj, path):
        if "embedder" in str(path):
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"
            )  # ENOSPC
        torch.save(obj.state_dict(), path)

    monkeypatch.setattr(pml_c_f, "save_model", disk_full)
    with pytest.raises(FileFault, match=r"writing the checkpoint .*embedder_3\.pth: the write failed"):
        hooks.save_models(trainer, str(tmp_path), 3, prev_suffix=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # epoch 2 whole, nothing of epoch 3
    assert pml_c_f.latest_version(str(tmp_path))[0] == 2
    plain = logging_presets.HookContainer(
        None
    )  # PML writes in place: the epoch's trunk, without its embedder
    with pytest.raises(RuntimeError, match="unexpected pos"):
        plain.save_models(trainer, str(tmp_path), 3, prev_suffix=2)
    assert (tmp_path / "trunk_3.pth").exists() and not (tmp_path / "embedder_3.pth").exists()


def test_hook_container_unreadable_checkpoint_loaded(tmp_path):
    trainer, hooks = Trainer(), compat.HookContainer(None)
    hooks.save_models(trainer, str(tmp_path), 1)
    (tmp_path / "embedder_1.pth").write_bytes((tmp_path / "embedder_1.pth").read_bytes()[:50])
    with pytest.raises(RuntimeError) as plain:  # PML: torch's own error, no file named
        logging_presets.HookContainer(None).load_latest_saved_models(trainer, str(tmp_path), "cpu")
    assert "embedder_1.pth" not in str(plain.value)
    with pytest.raises(
        FileFault, match=r"checkpoint .*embedder_1\.pth is unreadable.*delete the files of that epoch"
    ):
        hooks.load_latest_saved_models(trainer, str(tmp_path), "cpu")
    hooks.save_models(trainer, str(tmp_path), 1)
    assert hooks.load_latest_saved_models(trainer, str(tmp_path), "cpu") == 2


def test_hook_container_records_ahead_of_checkpoints(tmp_path):
    """Killed after an epoch's records, before its checkpoints: the resumed run starts from
    the epoch before and must not find that epoch's rows already there."""
    models = tmp_path / "models"
    models.mkdir()
    trainer = Trainer()

    def recorded(folder):
        keeper = legacy_keeper(folder)
        for epoch in (-1, 0, 1, 2):
            keeper.update_records({"epoch": epoch, "map": epoch / 10}, epoch, parent_name="accuracies")
            keeper.save_records()
        return keeper

    compat.HookContainer(None).save_models(trainer, str(models), 1)  # epoch 2's checkpoints never written
    plain = logging_presets.HookContainer(recorded(tmp_path / "plain"))
    assert plain.load_latest_saved_models(trainer, str(models), "cpu") == 2  # epoch 2 is trained again
    assert [r["epoch"] for r in table_rows(tmp_path / "plain", "accuracies")] == [
        -1,
        0,
        1,
        2,
    ]  # and recorded twice
    hooks = compat.HookContainer(recorded(tmp_path / "shim"))
    assert hooks.load_latest_saved_models(trainer, str(models), "cpu") == 2
    assert [r["epoch"] for r in table_rows(tmp_path / "shim", "accuracies")] == [-1, 0, 1]
    assert len((tmp_path / "shim" / "accuracies.csv").read_text().splitlines()) == 1 + 3
    hooks = compat.HookContainer(recorded(tmp_path / "best"))
    hooks.save_models(trainer, str(models), "best1")
    assert hooks.load_latest_saved_models(trainer, str(models), "cpu", best=True) == 2
    assert len(table_rows(tmp_path / "best", "accuracies")) == 4  # --resume_training best: the user's choice


def test_tester_factory_reference_set(tmp_path):
    spec = {
        "GlobalEmbeddingSpaceTester": {
            "reference_set": "compared_to_self",
            "dataloader_num_workers": 0,
            "accuracy_calculator": {"AccuracyCalculator": {"k": "max_bin_count"}},
        }
    }
    compat.restore_identity_in_pml()
    getter = SingleExperimentRunner(root_config_folder=launcher.default_config_root()).pytorch_getter
    with pytest.raises(TypeError, match="reference_set"):
        pb_factories.TesterFactory(getter=getter).create(spec, kwargs={"plots_folder": str(tmp_path)})
    tester = compat.TesterFactory(getter=getter).create(spec, kwargs={"plots_folder": str(tmp_path)})
    assert isinstance(tester, testers.GlobalEmbeddingSpaceTester)
    assert tester.accuracy_calculator.k == "max_bin_count"
    spec["GlobalEmbeddingSpaceTester"]["reference_set"] = "compared_to_training_set"
    with pytest.raises(ValueError, match="reference_set"):
        compat.TesterFactory(getter=getter).create(spec, kwargs={"plots_folder": str(tmp_path)})


def test_hook_container_split_names_as_splits_to_eval(tmp_path):
    dataset_dict, trunk = make_dataset_dict(), torch.nn.Identity()
    plain, tester = logging_presets.HookContainer(legacy_keeper(tmp_path / "plain")), make_tester()
    tester.reference_split_names["val"] = ["val"]  # not the failure tested here
    with pytest.raises(ValueError, match="unpack"):
        plain.run_tester_separately(tester, dataset_dict, 1, trunk, trunk, splits_to_eval=["val"])
    hooks, tester = compat.HookContainer(legacy_keeper(tmp_path / "shim")), make_tester()
    tester.end_of_testing_hook = hooks.end_of_testing_hook
    assert hooks.run_tester_separately(tester, dataset_dict, 1, trunk, trunk, splits_to_eval=["val"])
    assert tester.reference_split_names == {"val": ["val"]}
    assert tester.all_accuracies["val"][f"{MAP_R}_level0"] > 0.5
    # already evaluated at this epoch: skipped, as pb's skip_eval_if_already_done asks
    hooks.record_keeper.save_records()
    assert not hooks.run_tester_separately(tester, dataset_dict, 1, trunk, trunk, splits_to_eval=["val"])


def test_hook_container_records_named_before_testing(tmp_path):
    plain = logging_presets.HookContainer(legacy_keeper(tmp_path / "plain"))
    with pytest.raises(KeyError, match="val"):
        plain.record_group_name(make_tester(), "val")
    hooks, tester = compat.HookContainer(legacy_keeper(tmp_path / "shim")), make_tester()
    before = hooks.record_group_name(tester, "val")
    assert before.endswith("_VAL_vs_self")
    tester.test(make_dataset_dict(), 1, torch.nn.Identity(), splits_to_eval=[("val", ["val"])])
    assert hooks.record_group_name(tester, "val") == before


def test_hook_container_hooks_without_record_keeper():
    tester = make_tester()
    tester.reference_split_names["val"] = ["val"]
    with pytest.raises(AttributeError, match="hash_map"):
        logging_presets.HookContainer(None).record_group_name(tester, "val")
    name = compat.HookContainer(None).record_group_name(make_tester(), "val")
    assert name == "accuracies_normalized_GlobalEmbeddingSpaceTester_level_0_VAL_vs_self"


def evaluate_as_pb_ensemble(hooks, tester, model_name):
    """What pb's BaseAPIParser.eval_ensemble does for one model: test with the model name
    as the epoch, then write trained_status at iteration (row count + 1)."""
    hooks.record_group_name_prefix = "ConcatenateEmbeddings"
    group = "ConcatenateEmbeddings_" + pb_c_f.get_eval_record_name_dict(hooks, tester, ["val"])["val"]
    hooks.run_tester_separately(
        tester, make_dataset_dict(), model_name, torch.nn.Identity(), torch.nn.Identity()
    )
    row = pb_c_f.try_getting_db_count(hooks.record_keeper, group) + 1
    hooks.record_keeper.update_records(
        {"trained_status": model_name}, row, input_group_name_for_non_objects=group
    )
    hooks.record_keeper.save_records()
    return group


def test_hook_container_ensemble_model_name_as_epoch(tmp_path):
    class PlainEndOfTesting(compat.HookContainer):
        end_of_testing_hook = logging_presets.HookContainer.end_of_testing_hook

    plain, tester = PlainEndOfTesting(legacy_keeper(tmp_path / "plain")), make_tester()
    tester.end_of_testing_hook = plain.end_of_testing_hook
    with pytest.raises(TypeError, match="'<'"):
        evaluate_as_pb_ensemble(plain, tester, "trained")
    hooks, tester = compat.HookContainer(legacy_keeper(tmp_path / "shim")), make_tester()
    tester.end_of_testing_hook = hooks.end_of_testing_hook
    for model_name in ("untrained_trunk", "trained"):
        group = evaluate_as_pb_ensemble(hooks, tester, model_name)
    rows = table_rows(tmp_path / "shim", group)
    assert [(r["epoch"], r["trained_status"]) for r in rows] == [
        ("untrained_trunk", "untrained_trunk"),
        ("trained", "trained"),
    ]
    assert all(r[f"{MAP_R}_level0"] > 0.5 for r in rows)


def test_loss_factory_nested_losses_from_yaml(getter):
    multiple = {
        "MultipleLosses": {
            "losses": {
                "a": {"ContrastiveLoss": {}},
                "b": {"ProxyAnchorLoss": {"embedding_size": 8}},
            },
            "weights": {"a": 1.0, "b": 0.5},
        }
    }
    memory = {
        "CrossBatchMemory": {
            "loss": {"ContrastiveLoss": {}},
            "miner": {"MultiSimilarityMiner": {"epsilon": 0.1}},
            "embedding_size": 8,
            "memory_size": 16,
        }
    }
    for spec in (multiple, memory):
        # TypeError (no num_classes for the inner loss), or the inner spec passed on as a dict
        with pytest.raises(Exception, match="num_classes|not supported for dict"):
            pb_factories.LossFactory(getter=getter).create(spec, kwargs={"num_classes": 5})
    loss = compat.LossFactory(getter=getter).create(multiple, kwargs={"num_classes": 5})
    assert loss.losses["b"].proxies.shape == (5, 8) and loss.weights == {"a": 1.0, "b": 0.5}
    loss = compat.LossFactory(getter=getter).create(memory, kwargs={"num_classes": 5})
    assert isinstance(loss.loss, pml_losses.ContrastiveLoss) and loss.memory_size == 16
    assert type(loss.miner).__name__ == "MultiSimilarityMiner"
    embeddings, labels = torch.randn(10, 8), torch.arange(5).repeat(2)
    assert torch.isfinite(loss(embeddings, labels))
