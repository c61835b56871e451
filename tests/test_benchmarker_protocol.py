"""The MLRC protocol's guarantees that pb 0.9.33 does not keep (protocol.py): class-disjoint
folds for every class count, no report with a missing row or an unselected trained model,
no duplicate records on a rerun."""

import types

import pytest
import torch

from .pb_support import pb_skip

MISSING, pytestmark = pb_skip("powerful_benchmarker", "torchvision")
if not MISSING:
    import numpy as np
    from powerful_benchmarker import split_managers as pb_split_managers
    from powerful_benchmarker.utils import constants as const

    from pml_fieldlosses.app.benchmarker import protocol, records

SPLIT = {
    "test_size": 0.5, "test_start_idx": 0.5, "num_training_partitions": 4, "num_training_sets": 4,
    "hierarchy_level": 0, "data_and_label_getter_keys": ["data", "label"],
}  # fmt: skip


class Labels(torch.utils.data.Dataset):
    def __init__(self, num_classes):
        self.labels = np.repeat(np.arange(num_classes), 2)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"data": i, "label": self.labels[i]}


def folds(cls, num_classes):
    """[{split name: class set}] per fold, through pb's whole split machinery."""
    manager = cls(**SPLIT)
    dataset = Labels(num_classes)
    manager.create_split_schemes({t: {s: dataset for s in manager.split_names} for t in ("train", "eval")})
    out = []
    for name in manager.split_scheme_names:
        manager.set_curr_split_scheme(name)
        out.append({s: {int(c) for c in manager.get_label_set("eval", s)} for s in manager.split_names})
    return out


@pytest.mark.parametrize("num_classes", [9, 10, 11, 13, 16, 17, 24, 31, 200, 1883])
def test_folds_are_class_disjoint_for_every_class_count(num_classes):
    result = folds(protocol.MLRCSplitManager, num_classes)
    assert len(result) == 4
    test = result[0]["test"]
    assert test == set(range(num_classes // 2, num_classes))  # the second half, as pb
    vals = []
    for fold in result:
        assert fold["test"] == test
        for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
            assert not fold[a] & fold[b], (num_classes, a, b)
        assert fold["train"] | fold["val"] == set(range(num_classes // 2))
        assert len(fold["val"]) == (num_classes // 2) // 4
        vals.append(fold["val"])
    for i in range(4):  # val partitions of different folds are disjoint too
        for j in range(i):
            assert not vals[i] & vals[j]


@pytest.mark.parametrize("num_classes", [16, 24, 200])
def test_same_folds_as_pb_where_pbs_are_right(num_classes):
    assert folds(protocol.MLRCSplitManager, num_classes) == folds(
        pb_split_managers.MLRCSplitManager, num_classes
    )


@pytest.mark.parametrize("num_classes", [11, 19, 1883])
def test_pbs_split_is_the_defect(num_classes):
    """pb's folds for these counts are not class-disjoint: it fails (its own disjointness
    assertion, or a one-class val range); ours are (test above)."""
    with pytest.raises((UnboundLocalError, AssertionError)):
        folds(pb_split_managers.MLRCSplitManager, num_classes)


def test_too_few_classes_is_a_clear_error():
    with pytest.raises(protocol.ProtocolError, match="at least"):
        folds(protocol.MLRCSplitManager, 7)


def test_trainval_size_from_test_size():
    manager = protocol.MLRCSplitManager(**{**SPLIT, "test_size": 0.3, "test_start_idx": 0.7})
    trainval, test = manager.get_trainval_and_test(None, list(range(10)))
    assert (len(trainval), len(test)) == (7, 3)


class FakeHooks:
    """What the aggregator asks a fold's hook container: accuracies per epoch of a split."""

    validation_split_name = "val"

    def __init__(self, best_val_epoch, epochs):
        self.best_val_epoch, self.epochs = best_val_epoch, epochs

    def get_accuracies_of_epoch(self, tester, split, epoch):
        return [{"mean_average_precision_at_r_level0": self.epochs[epoch]}] if epoch in self.epochs else []

    def get_accuracies_of_best_epoch(self, tester, split, ignore_epoch=()):
        kept = {e: a for e, a in self.epochs.items() if e not in ignore_epoch}
        if not kept:
            return [], None
        best = max(kept, key=kept.get)
        return [
            {"mean_average_precision_at_r_level0": kept[best], "epoch": best}
        ], "mean_average_precision_at_r"

    def get_best_epoch_and_accuracy(self, tester, split):
        return self.best_val_epoch, 0.0


TESTER = types.SimpleNamespace(
    accuracy_calculator=types.SimpleNamespace(get_curr_metrics=lambda: ["mean_average_precision_at_r"])
)


def aggregate(tmp_path, per_fold, split="test"):
    aggregator = protocol.MeanAggregator(split_to_aggregate="val")
    for fold, hooks in per_fold.items():
        aggregator.update_accuracies(fold, [split], hooks, TESTER)
    keeper = records.get_legacy_record_keeper(csv_folder=str(tmp_path))
    aggregator.get_eval_record_name_dict = lambda hooks, tester, names: {n: f"agg_{n}" for n in names}
    aggregator.record_accuracies([split], keeper, None, TESTER)
    return keeper


def test_trained_model_never_selected_is_an_error(tmp_path):
    # --evaluate on test after a training whose best val epoch is 0 in every fold: pb
    # evaluates the epoch-0 checkpoint, which its aggregator skips as untrained
    per_fold = {f"fold{i}": FakeHooks(0, {-1: 0.1, 0: 0.2}) for i in range(4)}
    with pytest.raises(protocol.ProtocolError, match="never selected"):
        aggregate(tmp_path, per_fold)


def test_a_trial_that_never_trains_is_a_validation_result_not_an_error(tmp_path):
    # training (and a Bayesian-optimisation trial) aggregates the validation split: hyperparameters
    # under which no epoch beats epoch 0 give a bad result, which the optimisation must see
    per_fold = {f"fold{i}": FakeHooks(0, {-1: 0.1, 0: 0.2}) for i in range(4)}
    keeper = aggregate(tmp_path, per_fold, split="val")
    rows = keeper.query("SELECT * FROM agg_val ORDER BY id", use_global_db=False)
    trained = [r for r in rows if r[const.TRAINED_STATUS_COL_NAME] == const.TRAINED]
    assert len(trained) == 1  # the selected (epoch 0) accuracies, which pb left out
    assert np.isclose(trained[0]["mean_average_precision_at_r_level0"], 0.2)


def test_report_missing_rows_is_an_error(tmp_path):
    per_fold = {f"fold{i}": FakeHooks(4, {-1: 0.1, 0: 0.2, 4: 0.3}) for i in range(3)}
    per_fold["fold3"] = FakeHooks(0, {-1: 0.1, 0: 0.2})
    with pytest.raises(protocol.ProtocolError, match="no 'trained' row for fold.s. fold3"):
        aggregate(tmp_path, per_fold)


def test_reruns_do_not_duplicate_records(tmp_path):
    per_fold = {f"fold{i}": FakeHooks(4, {-1: 0.1, 0: 0.2, 4: 0.3 + i / 100}) for i in range(4)}
    for _ in range(3):
        keeper = aggregate(tmp_path, per_fold)
    rows = keeper.query("SELECT * FROM agg_test ORDER BY id", use_global_db=False)
    assert [r[const.TRAINED_STATUS_COL_NAME] for r in rows] == list(protocol.STATUSES)
    assert np.isclose(rows[-1]["mean_average_precision_at_r_level0"], 0.315)
    per_fold["fold0"] = FakeHooks(4, {-1: 0.1, 0: 0.2, 4: 0.5})  # new results are recorded
    rows = aggregate(tmp_path, per_fold).query("SELECT * FROM agg_test ORDER BY id", use_global_db=False)
    assert len(rows) == 6


def test_trained_ensemble_of_untrained_models_is_an_error(tmp_path):
    for i, epoch in enumerate((3, 0)):
        folder = tmp_path / f"fold{i}"
        folder.mkdir()
        (folder / f"trunk_best{epoch}.pth").write_bytes(b"")
    ensemble = protocol.ConcatenateEmbeddings()
    with pytest.raises(protocol.ProtocolError, match="fold1"):
        ensemble.get_list_of_models(
            None, {}, "trained", {}, [str(tmp_path / "fold0"), str(tmp_path / "fold1")], None
        )
