"""What powerful-benchmarker 0.9.33 needs to run on PML 2.x, record-keeper >= 0.9.32 and numpy 2.

pb 0.9.33 was written for PML 0.9.92 and record-keeper 0.9.29. Each shim below is
named after what it fixes and is covered by a test in tests/test_benchmarker_compat.py;
docs/benchmarker.md explains each one. Nothing here runs at import time: the launcher
calls ``restore_identity_in_pml()`` and registers the classes (pb looks factories, hook
containers and API parsers up by class name, so ours replace pb's under the same names).
The Bayesian optimisation runner, which needs the current ax API, is in bayes_opt.py.
"""

import copy
import datetime
import os

import record_keeper
import torch
from powerful_benchmarker import api_parsers
from powerful_benchmarker import factories as pb_factories
from powerful_benchmarker.utils import common_functions as pb_c_f
from pytorch_metric_learning.utils import common_functions as pml_c_f
from pytorch_metric_learning.utils import logging_presets


def restore_identity_in_pml():
    """PML 2 removed ``common_functions.Identity``; pb uses it to register the ``Identity``
    model, to replace a trunk's last layer and as the embedder of an untrained trunk.
    It was equal to ``torch.nn.Identity``. Idempotent."""
    if not hasattr(pml_c_f, "Identity"):
        pml_c_f.Identity = torch.nn.Identity


class LegacyRecordKeeper(record_keeper.RecordKeeper):
    """record-keeper as pb 0.9.33 uses it (written for 0.9.29). Fixes:

    - group_name_keyword_renamed: 0.9.31 renamed ``update_records(input_group_name_for_non_objects=)``
      to ``parent_name=`` (pb uses the old name for its meta records).
    - timestamps_dropped: 0.9.31 silently drops datetime values (pb's ``timestamp``
      column); they are stored as ISO text.
    - record_names_hashed: 0.9.31 replaces record group names whose middle part is longer
      than 64 characters by a hash, but pb reads its aggregator and ensemble tables back
      by their full names (e.g. with ``pca`` in the tester's name): names are kept.
    """

    def update_records(self, record_these, global_iteration, input_group_name_for_non_objects=None, **kwargs):
        if input_group_name_for_non_objects is not None:
            kwargs["parent_name"] = input_group_name_for_non_objects
        record_these = {
            k: v.isoformat(sep=" ") if isinstance(v, datetime.datetime) else v
            for k, v in record_these.items()
        }
        super().update_records(record_these, global_iteration, **kwargs)

    def append_primitive(self, group, series, value, global_iteration):
        if group == "":
            raise ValueError("group cannot be an empty string")
        self.append_data(group, series, value, global_iteration)


def get_legacy_record_keeper(save_figures=None, **kwargs):
    """``logging_presets.get_record_keeper`` without pb's ``save_figures`` argument (removed
    in PML 2 / record-keeper 0.9.31; it only drew list records as figures), returning a
    LegacyRecordKeeper, with its CSV files cut back to what its database holds
    (``drop_csv_rows_of_interrupted_saves``)."""
    keeper, _, _ = logging_presets.get_record_keeper(**kwargs)
    drop_csv_rows_of_interrupted_saves(keeper.record_writer)
    return LegacyRecordKeeper(
        keeper.tensorboard_writer, keeper.record_writer, keeper.attributes_to_search_for
    )


def drop_csv_rows_of_interrupted_saves(record_writer):
    """Fixes csv_rows_of_interrupted_saves: record-keeper appends each record to its CSV
    file and then to its SQLite database, the copy pb reads back when it resumes. A run
    killed between the two leaves CSV rows the database lacks; the resumed run computes
    those records again and appends them a second time. The database is the record of
    what was completed, so each CSV file is cut back to as many data rows as its table
    has (both are append-only, in the same order), before anything new is written."""
    folder = record_writer.folder
    if not os.path.isdir(folder):
        return
    for file_name in sorted(os.listdir(folder)):
        table, extension = os.path.splitext(file_name)
        if extension != ".csv":
            continue
        path = os.path.join(folder, file_name)
        completed = 0
        if record_writer.table_exists(table):
            completed = record_writer.query(f"SELECT COUNT(*) AS n FROM '{table}'")[0]["n"]
        with open(path) as f:
            lines = f.read().splitlines(keepends=True)
        kept, data_rows = [], 0
        for line in lines:
            if data_rows == completed:
                break
            kept.append(line)
            data_rows += not line.startswith("~iteration~")
        if len(kept) == len(lines):
            continue
        if data_rows == 0:
            os.remove(path)
        else:
            with open(path, "w") as f:
                f.writelines(kept)


class RecordKeeperFactory(pb_factories.RecordKeeperFactory):
    """Fixes: get_record_keeper(save_figures=...) no longer exists; old update_records keyword."""

    def _create_general(self, record_keeper_type):
        return get_legacy_record_keeper(**record_keeper_type)


class TesterFactory(pb_factories.TesterFactory):
    """PML 2 testers have no ``reference_set`` argument: the references of each query split
    come with ``splits_to_eval``. pb's configs say ``reference_set: compared_to_self`` (the
    MLRC protocol), which HookContainer below turns into (split, [split]) pairs."""

    def _create_general(self, tester_type, plots_folder, **kwargs):
        ((name, params),) = tester_type.items()
        params = dict(params or {})
        reference_set = params.pop("reference_set", "compared_to_self")
        if reference_set != "compared_to_self":
            raise ValueError(
                f"tester reference_set={reference_set!r} is not supported with PML 2: only "
                "'compared_to_self' (each split of splits_to_eval is its own reference set, as in MLRC)"
            )
        return super()._create_general({name: params}, plots_folder, **kwargs)


class NoRecordKeeper:
    """Stands in for the record keeper of pb's name-only hooks (``get_dummy_hook_and_tester``
    passes ``record_keeper=None``; PML 2 reads ``record_keeper.hash_map`` to name records)."""

    def __init__(self):
        self.hash_map = {}


class HookContainer(logging_presets.HookContainer):
    """PML 2's HookContainer as pb 0.9.33 calls it. Fixes:

    - split_names_as_splits_to_eval: pb passes ``splits_to_eval`` as split names, PML 2
      testers take (query, [references]) pairs (and PML 2.9's own ``run_tester_separately``
      hands the names to the tester unchanged): each split is compared to itself.
    - records_named_before_testing: PML 2 names records after the references the tester
      last used, a KeyError for a tester that has not run yet (pb's aggregator, ensemble,
      dummy testers): a split not yet tested is compared to itself.
    - hooks_without_record_keeper: pb's dummy hooks have ``record_keeper=None``.
    - ensemble_model_name_as_epoch: pb's ensemble evaluation passes the model name
      ("trained", ...) as the epoch, and then writes the row's ``trained_status`` at
      iteration (row count + 1); record-keeper >= 0.9.31 keys rows by iteration (0.9.29
      appended columns), so the accuracies are written at that same iteration.
    """

    def __init__(self, record_keeper, **kwargs):
        super().__init__(NoRecordKeeper() if record_keeper is None else record_keeper, **kwargs)

    def record_group_name(self, tester, split_name):
        tester.reference_split_names.setdefault(split_name, [split_name])
        return super().record_group_name(tester, split_name)

    def run_tester_separately(
        self,
        tester,
        dataset_dict,
        epoch,
        trunk,
        embedder,
        splits_to_eval=None,
        collate_fn=None,
        skip_eval_if_already_done=True,
    ):
        names = list(dataset_dict) if splits_to_eval is None else list(splits_to_eval)
        if skip_eval_if_already_done:
            names = self.get_splits_to_eval(tester, dataset_dict, epoch, names)
            if len(names) == 0:
                pml_c_f.LOGGER.info("Already evaluated")
                return False
        tester.test(dataset_dict, epoch, trunk, embedder, [(name, [name]) for name in names], collate_fn)
        return True

    def end_of_testing_hook(self, tester):
        for split_name, accuracies in tester.all_accuracies.items():
            group_name = self.record_group_name(tester, split_name)
            epoch = accuracies["epoch"]
            iteration = epoch
            if isinstance(epoch, str):
                iteration = pb_c_f.try_getting_db_count(self.record_keeper, group_name) + 1
            self.record_keeper.update_records(accuracies, iteration, parent_name=group_name)
            _, _, best_epoch, best_accuracy = self.is_new_best_accuracy(tester, split_name, epoch)
            best = {"best_epoch": best_epoch, "best_accuracy": best_accuracy}
            self.record_keeper.update_records(best, iteration, parent_name=group_name)


class LossFactory(pb_factories.LossFactory):
    """pb's LossFactory for PML 2 losses that contain losses or miners. Fixes:

    - nested_losses_from_yaml: pb builds the inner losses of ``MultipleLosses`` and
      ``CrossBatchMemory`` without ``num_classes`` (TypeError) and calls an instance of
      its MinerFactory for an inner miner ("'MinerFactory' object is not callable").

    It also passes the model named ``embedder`` to a loss whose ``__init__`` takes an
    ``embedder`` argument (the DRML ``RelationalLoss``), and builds that loss's
    ``base_loss`` and ``branch_losses`` with ``embedding_size`` set to the embedder's
    output and branch sizes (``branch_losses`` given as one loss spec becomes a new loss
    per branch).
    """

    nested_loss_names = ("loss", "losses", "base_loss", "branch_losses")
    nested_miner_names = ("miner", "miners")

    def _create_general(self, loss_type, num_classes, models=None, embedding_size=None):
        loss_class, params = self.getter.get("loss", yaml_dict=loss_type, return_uninitialized=True)
        params = copy.deepcopy(params)
        if pb_c_f.check_init_arguments(loss_class, "embedder") and "embedder" not in params:
            params["embedder"] = embedder_model(models, loss_class)
        sizes = embedder_sizes(params.get("embedder"))
        for name in self.nested_loss_names:
            if name in params:
                params[name] = self.create_nested_losses(
                    name, params[name], num_classes, models, sizes.get(name)
                )
        for name in self.nested_miner_names:
            if name in params:
                params[name] = self.create_nested_miners(params[name])
        for name, value in (("num_classes", num_classes), ("embedding_size", embedding_size)):
            if value is not None and name not in params and pb_c_f.check_init_arguments(loss_class, name):
                params[name] = value
        for name in self.nested_loss_objects:
            if name in params:
                params[name] = self.create_nested_object(name, params[name])
        return loss_class(**params)

    def create_nested_losses(self, name, spec, num_classes, models, embedding_size):
        def create(one_spec):
            return self._create_general(one_spec, num_classes, models, embedding_size)

        if name == "branch_losses" and is_single_spec(spec):
            return lambda: create(spec)
        if name in ("loss", "base_loss"):
            return create(spec)
        if isinstance(spec, dict) and not is_single_spec(spec):
            return {k: create(v) for k, v in spec.items()}
        if isinstance(spec, (list, tuple)):
            return [create(v) for v in spec]
        return create(spec)

    def create_nested_miners(self, spec):
        miner_factory = pb_factories.MinerFactory(getter=self.getter)
        if isinstance(spec, dict) and not is_single_spec(spec):
            return {k: miner_factory.create(specs=v) for k, v in spec.items()}
        if isinstance(spec, (list, tuple)):
            return [miner_factory.create(specs=v) for v in spec]
        return miner_factory.create(specs=spec)

    def create_nested_object(self, name, spec):
        if "regularizer" in name:
            return self.get_nested_regularizer(spec)
        if name == "weight_init_func":
            return self.get_weight_init_func(spec)
        return self.getter.get(name, yaml_dict=spec)


def is_single_spec(spec):
    """A YAML ``{ClassName: {params}}`` (one key starting with a capital letter)."""
    return isinstance(spec, dict) and len(spec) == 1 and next(iter(spec))[:1].isupper()


def embedder_model(models, loss_class):
    if not models or "embedder" not in models:
        raise ValueError(
            f"{loss_class.__name__} needs the embedder model: use the MetricLossOnly trainer "
            "(pb's APIMetricLossOnly passes the models to the loss factory)"
        )
    return models["embedder"]


def embedder_sizes(embedder):
    if embedder is None:
        return {}
    return {
        "base_loss": getattr(embedder, "embedding_size", None),
        "branch_losses": getattr(embedder, "branch_size", None),
    }


class APIMetricLossOnly(api_parsers.BaseAPIParser):
    """pb's API parser for the MetricLossOnly trainer, also giving the loss factory the
    models (for losses built around the embedder, see LossFactory)."""

    def default_kwargs_loss_funcs(self):
        return {**super().default_kwargs_loss_funcs(), "models": lambda: self.models}


# registered with pb's runner by registration.register(): kind -> classes
REGISTRATIONS = {
    "factory": [RecordKeeperFactory, TesterFactory, LossFactory],
    "hook_container": [HookContainer],
    "api_parser": [APIMetricLossOnly],
}
