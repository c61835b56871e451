"""Fixes for the guarantees of the MLRC protocol that pb 0.9.33 does not keep: class-disjoint
folds, a report with every row, a trained model that was selected, no duplicate records.
Each fix is named after what it fixes and tested in tests/test_benchmarker_protocol.py."""

import numpy as np
from powerful_benchmarker import aggregators as pb_aggregators
from powerful_benchmarker import ensembles as pb_ensembles
from powerful_benchmarker import split_managers as pb_split_managers
from powerful_benchmarker.utils import common_functions as pb_c_f
from powerful_benchmarker.utils import constants as const
from pytorch_metric_learning.utils import common_functions as pml_c_f
from scipy import stats as scipy_stats

STATUSES = (const.UNTRAINED_TRUNK, const.UNTRAINED_TRUNK_AND_EMBEDDER, const.TRAINED)


class ProtocolError(RuntimeError):
    """A run whose results would not be what the MLRC protocol reports (the launcher
    prints it as one line and exits non-zero)."""


class MLRCSplitManager(pb_split_managers.MLRCSplitManager):
    """pb's MLRC split (4 class-disjoint folds of the training classes, the rest for
    testing). Fixes:

    - folds_overlap_for_some_class_counts: pb sizes each fold's train and val partitions
      from the count of *all* classes, not of the training classes, and lays them out as
      wrapped value ranges: with an odd class count (e.g. 11 classes: 5 training classes
      but 5 train + 1 val slots) a class lands in both train and val of a fold, and a val
      range of one class is an UnboundLocalError. Here, as in pb, fold p's train
      partition starts at position ``int(p / P * n)`` of the n training classes and its
      val partition follows it (wrapping), but with ``n // P`` val classes and the other
      ``n - n // P`` for training: the same folds as pb's where pb's are disjoint.
    - trainval_size_from_test_size: pb takes as many training classes as test classes
      (``input_list[:test_length]``), right only for ``test_size: 0.5``; here it is
      ``round(n_all * (1 - test_size))`` (for 0.5: the first half, n_all // 2, as pb).
    """

    def get_trainval_and_test(self, dataset, input_list):
        num_trainval = int(round(len(input_list) * (1 - self.test_size), 9))
        return input_list[:num_trainval], input_list[num_trainval:]

    def get_kfold_generator(self, dataset, trainval_set):
        n, folds = len(trainval_set), self.num_training_partitions
        val_length = n // folds
        if val_length < 1 or n - val_length < 1:
            raise ProtocolError(
                f"the MLRC split needs at least num_training_partitions + 1 = {folds + 1} training "
                f"classes, got {n}: use more classes or fewer partitions"
            )
        train_length = n - val_length
        tuples = []
        for partition in range(folds):
            start = int(partition / folds * n)
            train = sorted((start + j) % n for j in range(train_length))
            val = sorted((start + train_length + j) % n for j in range(val_length))
            tuples.append((train, val))
        return tuples


class MeanAggregator(pb_aggregators.MeanAggregator):
    """pb's fold mean ("separated" accuracies). Fixes:

    - trained_model_never_selected: when every fold's best validation epoch is 0 (the
      untrained embedder), pb's test report has no "trained" row at all, with exit code 0:
      an error here for every split but the validation split itself (whose fold mean at the
      selected epochs stays a result: a Bayesian-optimisation trial with hyperparameters
      that do not train is a bad trial, not a broken run). There, a fold whose selected
      epoch is 0 gets that epoch's accuracies as its "trained" ones (pb left them out, and
      its trial result, read from the last "trained" row, failed with an IndexError).
    - report_missing_rows: a status (untrained trunk, untrained trunk + embedder,
      trained) without accuracies for every fold was averaged over the folds it had, or
      left out: an error naming the folds.
    - duplicate_records_on_rerun: each rerun appended the same fold means again; rows
      equal to the last recorded ones are not written again.
    """

    def update_accuracies(self, split_scheme_name, splits_to_eval, hooks, tester):
        super().update_accuracies(split_scheme_name, splits_to_eval, hooks, tester)
        best_epoch, _ = hooks.get_best_epoch_and_accuracy(tester, hooks.validation_split_name)
        self.selected_epochs = getattr(self, "selected_epochs", {})
        self.selected_epochs[split_scheme_name] = best_epoch
        rows = self.meta_accuracies[self.split_to_aggregate]
        if self.split_to_aggregate in splits_to_eval and best_epoch is not None and best_epoch <= 0:
            for metric, folds in rows[const.UNTRAINED_TRUNK_AND_EMBEDDER].items():
                rows[const.TRAINED][metric].setdefault(split_scheme_name, folds[split_scheme_name])

    def check_complete(self, splits_to_eval):
        epochs = getattr(self, "selected_epochs", {})
        beyond_validation = any(split != self.split_to_aggregate for split in splits_to_eval)
        if beyond_validation and epochs and all(e is not None and e <= 0 for e in epochs.values()):
            raise ProtocolError(
                "the trained model was never selected: in every fold the best validation epoch is 0 "
                f"(the untrained model; best epochs {epochs}); train longer or with a larger learning rate"
            )
        folds = sorted(epochs)
        for split in splits_to_eval:
            for status in STATUSES:
                accuracies = self.meta_accuracies[split][status]
                have = set(pb_c_f.first_val_of_dict(accuracies)) if accuracies else set()
                missing = [f for f in folds if f not in have]
                if not missing or (status != const.TRAINED and not accuracies):
                    continue  # complete, or untrained rows not asked for (check_untrained_accuracy)
                detail = ""
                if status == const.TRAINED:
                    detail = " (their selected model is the untrained one: best validation epoch 0)"
                raise ProtocolError(
                    f"the {split} report has no '{status}' row for fold(s) {', '.join(missing)}{detail}"
                )

    def record_accuracies(self, splits_to_eval, meta_record_keeper, hooks, tester):
        if len(self.meta_accuracies) == 0:
            return
        self.check_complete(splits_to_eval)
        group_names = self.get_eval_record_name_dict(hooks, tester, splits_to_eval)
        for split in splits_to_eval:
            group_name = group_names[split]
            rows = {}
            for status, accuracies in self.meta_accuracies[split].items():
                if len(accuracies) == 0:
                    continue
                rows[status] = {k: self.get_aggregate_performance(v) for k, v in accuracies.items()}
                if len(pb_c_f.first_val_of_dict(accuracies)) > 1:
                    rows[status].update(
                        {f"SEM_{k}": scipy_stats.sem(list(v.values())) for k, v in accuracies.items()}
                    )
            if all(same_as_last_row(meta_record_keeper, group_name, s, row) for s, row in rows.items()):
                continue  # a rerun: these rows are the last ones recorded
            count = pb_c_f.try_getting_db_count(meta_record_keeper, group_name)
            for status, row in rows.items():
                count += 1
                row[const.TRAINED_STATUS_COL_NAME] = status
                row["timestamp"] = pb_c_f.get_datetime()
                meta_record_keeper.update_records(row, global_iteration=count, parent_name=group_name)
        meta_record_keeper.save_records()


def same_as_last_row(record_keeper, table, status, row):
    if not record_keeper.record_writer.table_exists(table):
        return False
    last = record_keeper.query(
        f"SELECT * FROM {table} WHERE {const.TRAINED_STATUS_COL_NAME}=? ORDER BY id DESC LIMIT 1",
        values=(status,),
        use_global_db=False,
    )
    if not last:
        return False
    last = dict(last[0])
    return all(
        k in last and last[k] is not None and np.isclose(last[k], v, rtol=0, atol=1e-12)
        for k, v in row.items()
    )


class ConcatenateEmbeddings(pb_ensembles.ConcatenateEmbeddings):
    """pb's concatenated ensemble. Fixes trained_ensemble_of_untrained_models: pb's
    "trained" ensemble loads each fold's best checkpoint, which is the epoch-0 (untrained)
    one in a fold whose validation accuracy never improved: an error naming the folds."""

    def get_list_of_models(
        self, model_factory, model_args, model_name, factory_kwargs, split_folders, device
    ):
        if model_name in const.TRAINED_ALIASES:
            untrained = [f for f in split_folders if pml_c_f.latest_version(f, best=True)[0] <= 0]
            if untrained:
                raise ProtocolError(
                    "the concatenated 'trained' model would hold untrained models: the best checkpoint "
                    f"is epoch 0 in {', '.join(untrained)}"
                )
        return super().get_list_of_models(
            model_factory, model_args, model_name, factory_kwargs, split_folders, device
        )
