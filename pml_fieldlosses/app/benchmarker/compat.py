"""What powerful-benchmarker 0.9.33 needs to run on PML 2.x, record-keeper >= 0.9.32 and numpy 2.

pb 0.9.33 was written for PML 0.9.92 and record-keeper 0.9.29. Each fix below is
named after what it fixes and is covered by a test in tests/test_benchmarker_compat.py;
docs/benchmarker.md explains each one. Nothing here runs at import time: the launcher
calls ``restore_identity_in_pml()`` and registers the classes (pb looks factories, hook
containers and API parsers up by class name, so ours replace pb's under the same names).
The record-keeper fixes are in records.py; the Bayesian optimisation loop, which needs
the current ax API, is in bayes_opt.py (its parallel trials on Ray in parallel.py). Our own
classes (losses, the DRML head, models, datasets) are registered in registration.py.
"""

import copy
import os

import torch
from powerful_benchmarker import factories as pb_factories
from powerful_benchmarker.utils import common_functions as pb_c_f
from pytorch_metric_learning.utils import common_functions as pml_c_f
from pytorch_metric_learning.utils import logging_presets

from ..errors import FileFault, UsageError, file_fault
from . import files, protocol, records
from .records import RecordKeeperFactory


def restore_identity_in_pml():
    """PML 2 removed ``common_functions.Identity``; pb uses it to register the ``Identity``
    model, to replace a trunk's last layer and as the embedder of an untrained trunk.
    It was equal to ``torch.nn.Identity``. Idempotent."""
    if not hasattr(pml_c_f, "Identity"):
        pml_c_f.Identity = torch.nn.Identity


class TesterFactory(pb_factories.TesterFactory):
    """PML 2 testers have no ``reference_set`` argument: the references of each query split
    come with ``splits_to_eval``. pb's configs say ``reference_set: compared_to_self`` (the
    MLRC protocol), which HookContainer below turns into (split, [split]) pairs."""

    def _create_general(self, tester_type, plots_folder, **kwargs):
        ((name, params),) = tester_type.items()
        params = dict(params or {})
        reference_set = params.pop("reference_set", "compared_to_self")
        if reference_set != "compared_to_self":
            raise UsageError(
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
    - checkpoints_written_in_place: PML writes each checkpoint file in place and logs a
      failed write as a warning; a run killed (or a disk full) in the middle leaves a
      truncated file of the newest epoch, which the resumed run loads (a traceback) or
      skips (the model untrained). Each file is written whole (a temporary file takes its
      name), the trunk's last (PML finds the newest epoch by it); a failed write is a
      FileFault naming the file.
    - unreadable_checkpoint_loaded: a checkpoint of the epoch to resume from that cannot
      be read is a FileFault naming it and its epoch's files (files.check_checkpoint).
    - records_ahead_of_checkpoints: a resumed run drops the records of the epochs after
      the checkpoint it resumes from (records.drop_records_after).
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

    def save_models(self, trainer, model_folder, curr_suffix, prev_suffix=None):
        if not self.do_save_models:
            return
        objects = [getattr(trainer, x, {}) for x in self.saveable_trainer_objects]
        written = []  # (temporary file, checkpoint file)
        try:
            for obj_dict in objects:
                for name, obj in obj_dict.items():
                    path = pml_c_f.modelpath_creator(model_folder, name, curr_suffix)
                    tmp = os.path.join(model_folder, f".{os.path.basename(path)}.tmp")
                    written.append((tmp, path))
                    save_checkpoint(obj, tmp, path)
            for tmp, path in sorted(written, key=lambda w: os.path.basename(w[1]).startswith("trunk_")):
                os.replace(tmp, path)
        except OSError as e:
            raise file_fault(e, path, "writing the checkpoint") from e
        finally:
            for tmp, _ in written:
                if os.path.exists(tmp):
                    os.remove(tmp)
        if prev_suffix is not None:
            for obj_dict in objects:
                pml_c_f.delete_dict_of_models(obj_dict, prev_suffix, model_folder)

    def load_latest_saved_models(self, trainer, model_folder, device=None, best=False):
        epoch, suffix = pml_c_f.latest_version(model_folder, "trunk_*.pth", best=best)
        if epoch > 0:
            files.check_checkpoints(model_folder, suffix)
        if not best and getattr(self.record_keeper, "record_writer", None) is not None:
            records.drop_records_after(self.record_keeper, epoch)
        return super().load_latest_saved_models(trainer, model_folder, device, best)

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


def save_checkpoint(obj, tmp, path):
    """PML's ``save_model`` of ``obj`` into ``tmp`` (the temporary file of ``path``); torch
    reports a failed write (a full disk: "[enforce fail at inline_container.cc:672] .
    unexpected pos 576 vs 534") as a RuntimeError of its zip writer: a FileFault naming
    ``path``."""
    try:
        pml_c_f.save_model(obj, tmp)
    except RuntimeError as e:
        if "inline_container" not in str(e) and "PytorchStreamWriter" not in str(e):
            raise
        raise FileFault(
            f"writing the checkpoint {path}: the write failed ({' '.join(str(e).split())}): the disk may be "
            "full; free space or choose a folder on another disk"
        ) from e


class LossFactory(pb_factories.LossFactory):
    """pb's LossFactory for PML 2 losses that contain losses or miners. Fixes:

    - nested_losses_from_yaml: pb builds the inner losses of ``MultipleLosses`` and
      ``CrossBatchMemory`` without ``num_classes`` (TypeError) and calls an instance of
      its MinerFactory for an inner miner ("'MinerFactory' object is not callable").
      The same for ``RelationalLoss``'s ``base_loss`` and ``branch_losses`` (one loss,
      the template RelationalLoss copies per branch, or a list).
    """

    nested_loss_names = ("loss", "losses", "base_loss", "branch_losses")
    nested_miner_names = ("miner", "miners")

    def _create_general(self, loss_type, num_classes):
        loss_class, params = self.getter.get("loss", yaml_dict=loss_type, return_uninitialized=True)
        params = copy.deepcopy(params)
        for name in self.nested_loss_names:
            if name in params:
                params[name] = self.create_nested_losses(name, params[name], num_classes)
        for name in self.nested_miner_names:
            if name in params:
                params[name] = self.create_nested_miners(params[name])
        if "num_classes" not in params and pb_c_f.check_init_arguments(loss_class, "num_classes"):
            params["num_classes"] = num_classes
        for name in self.nested_loss_objects:
            if name in params:
                params[name] = self.create_nested_object(name, params[name])
        return loss_class(**params)

    def create_nested_losses(self, name, spec, num_classes):
        def create(one_spec):
            return self._create_general(one_spec, num_classes)

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


class TransformFactory(pb_factories.TransformFactory):
    """Fixes transforms_written_into_config: pb's getter adds ``ToTensor``, ``Multiplier``
    and ``Normalize`` (with the trunk's ``mean``/``std``, whatever their type) to the
    transforms dict of the run's config in place; pb then saves that config with
    ``yaml.dump`` and reads it back with ``safe_load``, which refuses a tuple, a numpy
    value or any other non-YAML type (--evaluate, --resume_training, a resumed
    optimisation trial and the reproductions fail or start over). The getter gets a copy."""

    def _create_general(self, transform_type, trunk_model):
        return super()._create_general(copy.deepcopy(transform_type), trunk_model)


# registered with pb's runner by registration.register(): kind -> classes
REGISTRATIONS = {
    "factory": [RecordKeeperFactory, TesterFactory, LossFactory, TransformFactory],
    "hook_container": [HookContainer],
    "split_manager": [protocol.MLRCSplitManager],
    "aggregator": [protocol.MeanAggregator],
    "ensemble": [protocol.ConcatenateEmbeddings],
}
