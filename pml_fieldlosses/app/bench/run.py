"""One run: a loss trained with a seed by PML's own MetricLossOnly trainer and
logging hooks (our hooks only add timing and progress), its epoch selected on
validation MAP@R, tested once (the untrained row: baseline.py)."""

import contextlib
import logging
import random
import time
from pathlib import Path

import numpy as np
import torch
from pytorch_metric_learning import samplers, testers, trainers
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import logging_presets

from .. import catalog
from ..errors import ADVICE, FileFault, atomic_write
from . import metrics
from .features import ArrayDataset
from .protocol import training_labels
from .result import RunResult, file_system_fault

MODEL_KEYS = ("trunk", "embedder", "metric_loss")


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)  # PML's samplers draw from numpy's global generator
    torch.manual_seed(seed)


@contextlib.contextmanager
def run_log(path):
    """Send what PML writes during a run (its per-batch progress bars, warnings,
    log lines) to the run's log file, keeping the terminal for the bench's progress."""
    with open(path, "a") as log, contextlib.redirect_stderr(log):
        handler = logging.StreamHandler(log)
        c_f.LOGGER.addHandler(handler)
        previous = c_f.LOGGER.level
        c_f.LOGGER.setLevel(logging.INFO)
        try:
            yield
        finally:
            c_f.LOGGER.removeHandler(handler)
            c_f.LOGGER.setLevel(previous)


def make_tester(device, hooks=None):
    """PML's tester for the runs' models on ``device``: it sends each batch there (the
    kNN of the accuracy calculator runs on the CPU whatever the device)."""
    return testers.GlobalEmbeddingSpaceTester(
        normalize_embeddings=True,
        batch_size=512,
        dataloader_num_workers=0,
        data_device=torch.device(device),
        accuracy_calculator=metrics.accuracy_calculator(),
        end_of_testing_hook=None if hooks is None else hooks.end_of_testing_hook,
    )


class GradClipper:
    """Clips the gradient norm of ``parameters`` to ``max_norm`` (PML trainers call
    it between backward and the optimiser step) and counts the steps it clipped.

    The gradients are those of ``torch.nn.utils.clip_grad_norm_``, which scales them by
    min(1, max_norm / (norm + 1e-6)); a factor of exactly 1 is not applied (torch applies it
    to spare a GPU a synchronisation; on a CPU it is a pass over every gradient per step)."""

    def __init__(self, parameters, max_norm):
        self.parameters = [p for p in parameters if p.requires_grad]
        self.max_norm = max_norm
        self.steps = self.clipped = 0

    def __call__(self):
        grads = [p.grad for p in self.parameters if p.grad is not None]
        if not grads:
            return  # a frozen part (the trunk in its warm-up epochs): no step to count
        if not hasattr(torch.nn.utils, "clip_grads_with_norm_"):  # torch < 2.6
            norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.max_norm)
        else:
            norm = torch.nn.utils.get_total_norm(grads)
            # torch's factor; "not >= 1" scales a NaN norm's gradients too, as torch does
            if norm.device.type != "cpu" or not bool(self.max_norm / (norm + 1e-6) >= 1):
                torch.nn.utils.clip_grads_with_norm_(self.parameters, self.max_norm, norm)
        self.steps += 1
        self.clipped += int(norm > self.max_norm)

    def clipped_fraction(self):
        return self.clipped / self.steps if self.steps else 0.0


def optimisation(models, config, trunk_lr_multiplier):
    """An AdamW, a StepLR and a gradient clipper for each trained part, under PML's key names.
    The AdamWs take torch's multi-tensor implementation (``foreach=True``, torch's default on a
    GPU) also on a CPU, where torch's default is one tensor at a time: the same arithmetic in the
    same order, the same parameters bit for bit (tests/test_bench_speed.py), in fewer Python
    calls (2.2 ms against 3.7 ms for the bench's Linear(3888, 128) on one thread)."""
    lrs = {"embedder": config.lr}
    if any(p.requires_grad for p in models["trunk"].parameters()):
        lrs["trunk"] = config.lr * trunk_lr_multiplier
    if list(models["metric_loss"].parameters()):
        lrs["metric_loss"] = config.lr * config.loss_lr_multiplier
    optimizers, schedulers, clippers = {}, {}, {}
    for name, lr in lrs.items():
        optimizer = torch.optim.AdamW(
            models[name].parameters(), lr, weight_decay=config.weight_decay, foreach=True
        )
        optimizers[f"{name}_optimizer"] = optimizer
        schedulers[f"{name}_scheduler_by_epoch"] = torch.optim.lr_scheduler.StepLR(
            optimizer, config.lr_decay_epochs, config.lr_decay
        )
        if config.grad_clip:
            clippers[name] = GradClipper(models[name].parameters(), config.grad_clip)
    return optimizers, schedulers, clippers


class MetricLossOnly(trainers.MetricLossOnly):
    """PML's MetricLossOnly whose trunk is frozen during its first ``trunk_warmup_epochs``
    epochs: PML's own ``freeze_these`` (no gradient, no optimiser step) names the trunk at the
    start of those epochs and not after, when the trunk's trainable parameters are given their
    gradients back. The embedder and the loss's parameters train from the first epoch."""

    def __init__(self, *args, trunk_warmup_epochs=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.trunk_warmup_epochs = trunk_warmup_epochs
        self.trunk_parameters = [p for p in self.models["trunk"].parameters() if p.requires_grad]

    def set_to_train(self):
        warming_up = self.epoch <= self.trunk_warmup_epochs
        self.freeze_these = ("trunk",) if warming_up else ()
        if not warming_up:
            for parameter in self.trunk_parameters:
                parameter.requires_grad_(True)
        super().set_to_train()


class EpochHooks:
    """PML's logging hooks plus the wall seconds and mean loss of each epoch's
    training iterations (validation excluded) and a progress report after it."""

    def __init__(self, hooks, tester, end_of_epoch, report):
        self.hooks, self.tester, self.end_of_epoch, self.report = hooks, tester, end_of_epoch, report
        self.epoch_seconds, self.epoch_losses, self.total = [], [], 0.0
        self.start = time.perf_counter()

    def end_of_iteration(self, trainer):
        self.total += trainer.losses["total_loss"].detach().item()
        self.hooks.end_of_iteration_hook(trainer)

    def end_of_epoch_hook(self, trainer):
        self.epoch_seconds.append(time.perf_counter() - self.start)
        self.epoch_losses.append(self.total / trainer.iterations_per_epoch)
        keep_going = self.end_of_epoch(trainer)
        val = self.tester.all_accuracies.get("val", {}).get(f"{metrics.PRIMARY}_level0", float("nan"))
        self.report(epoch=trainer.epoch, seconds=time.perf_counter() - self.start, val=float(val))
        self.total, self.start = 0.0, time.perf_counter()
        return keep_going


def train_one(loss_name, seed, inputs, config, run_dir, tensorboard_dir, report=None, test=True):
    """Train ``loss_name`` with ``seed``, select the epoch by validation MAP@R
    (early stopping), test that model once (unless ``test`` is False: the
    hyperparameter selection never looks at the test split). Returns a RunResult."""
    entry = catalog.get_entry(loss_name)
    device = torch.device(config.device)
    run_dir, model_dir = Path(run_dir), Path(run_dir) / "models"
    split = inputs.split
    C, D = split.num_train_classes, config.embedding_size
    start = time.perf_counter()
    seed_everything(seed)
    labels, changed = training_labels(split, config.label_noise, seed)
    # small data sets: at most m samples of every training class in a batch
    batch_size = min(config.batch_size, config.m_per_class * C)

    trunk = inputs.make_trunk().to(device)
    embedder = entry.make_embedder(inputs.in_features, D).to(device)
    loss = entry.build(C, D).to(device)
    miner = entry.miner() if entry.miner else None
    models = {"trunk": trunk, "embedder": embedder, "metric_loss": loss}
    optimizers, schedulers, clippers = optimisation(models, config, inputs.trunk_lr_multiplier)

    from . import records  # record-keeper and TensorBoard (the bench extra) only when a run starts

    record_keeper, record_writer, writer = records.get_record_keeper(
        str(run_dir / "records"), str(tensorboard_dir)
    )
    # from here on the writer's thread runs: any error (a full disk making the model folder,
    # training, testing) closes it
    with closed_on_error(writer):
        hooks = logging_presets.get_hook_container(record_keeper, primary_metric=metrics.PRIMARY, log_freq=10)
        tester = make_tester(device, hooks)
        end_of_epoch = hooks.end_of_epoch_hook(
            tester,
            {"val": inputs.eval_dataset("val")},
            str(model_dir),
            test_interval=1,
            patience=config.patience,
            splits_to_eval=[("val", ["val"])],
            test_collate_fn=inputs.eval_collate,
        )
        timing = EpochHooks(hooks, tester, end_of_epoch, report or (lambda **info: None))
        trainer = MetricLossOnly(
            {"trunk": trunk, "embedder": embedder},
            optimizers,
            batch_size,
            {"metric_loss": loss},
            inputs.train_dataset(labels),
            mining_funcs={"tuple_miner": miner} if miner else {},
            sampler=samplers.MPerClassSampler(
                labels, config.m_per_class, batch_size, length_before_new_iter=max(len(labels), batch_size)
            ),
            dataloader_num_workers=0,
            data_device=device,
            collate_fn=inputs.train_collate,
            freeze_trunk_batchnorm=inputs.freeze_batchnorm,
            lr_schedulers=schedulers,
            gradient_clippers={f"{name}_grad_clipper": c for name, c in clippers.items()},
            end_of_iteration_hook=timing.end_of_iteration,
            end_of_epoch_hook=timing.end_of_epoch_hook,
            trunk_warmup_epochs=inputs.trunk_warmup_epochs,
        )
        trainer.train(num_epochs=config.epochs)
        best_epoch, best_val = hooks.get_best_epoch_and_accuracy(tester, "val")
        history = hooks.get_accuracy_history(tester, "val", return_all_metrics=True)
        results = distance = None
        if test:
            check_best_models(hooks, trainer, model_dir, best_epoch)
            hooks.load_latest_saved_models(trainer, str(model_dir), device, best=True)
            tester.test(
                {"test": inputs.eval_dataset("test")},
                best_epoch,
                trunk,
                embedder,
                splits_to_eval=[("test", ["test"])],
                collate_fn=inputs.eval_collate,
            )
            results = metrics.level0(tester.all_accuracies["test"])
            if seed == 0:
                save_embeddings(run_dir / "test_embeddings.npz", tester, inputs, trunk, embedder)
            distance = proxy_distance(loss, tester, inputs, trunk, embedder)
    if writer is not None:
        writer.close()
    record_writer.sync()
    keep_best_models(model_dir, best_epoch)
    return RunResult(
        loss=loss_name,
        origin=entry.origin,
        seed=seed,
        test=results,
        best_epoch=int(best_epoch),
        best_val_map_at_r=float(best_val),
        epochs_run=len(timing.epoch_seconds),
        epoch_seconds=timing.epoch_seconds,
        seconds_per_epoch=float(np.mean(timing.epoch_seconds)),
        epoch_losses=timing.epoch_losses,
        val_history={
            "epoch": [int(e) for e in history["epoch"]],
            "map_at_r": [float(v) for v in history[f"{metrics.PRIMARY}_level0"]],
        },
        label_noise={"fraction": config.label_noise, "changed": len(changed), "of": len(labels)},
        clipped_fraction={name: c.clipped_fraction() for name, c in clippers.items()},
        run_seconds=time.perf_counter() - start,
        proxy_distance=distance,
    )


@contextlib.contextmanager
def closed_on_error(writer):
    """Close the tensorboard ``writer`` (and its thread) if the block fails, while the run's
    log still takes what it prints; the block's error goes on."""
    try:
        yield
    except BaseException:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        raise


def check_best_models(hooks, trainer, model_dir, best_epoch):
    """PML's hooks only log a warning when a model cannot be saved (a read-only folder, a
    full disk), and then load no model or another epoch's: the files of the best epoch must
    all be there before that model is tested, else a FileFault names the first one missing."""
    suffix = f"best{best_epoch}"
    for objects in (getattr(trainer, name, {}) for name in hooks.saveable_trainer_objects):
        for key in objects:
            path = Path(c_f.modelpath_creator(str(model_dir), key, suffix))
            if not path.is_file():
                code = file_system_fault(model_dir)
                why = ADVICE[code] if code else "the file system refused it (log.txt says why)"
                raise FileFault(f"{path}, the model of the best epoch, was not saved: {why}")


def proxy_distance(loss, tester, inputs, trunk, embedder):
    """Mean over the proxies of ``loss`` (its ``proxies``: (C, D), or (C, M, D) for
    M per class) of the Euclidean distance from the proxy to the nearest clean
    training embedding of its class, both L2-normalised (the PFML paper's measure
    of how well proxies represent their data, §3.4/§4.4). None for a loss without
    proxies (or a class without training samples)."""
    proxies = getattr(loss, "proxies", None)
    if not isinstance(proxies, torch.Tensor):
        return None
    split = inputs.split
    embeddings, labels = tester.get_all_embeddings(
        ArrayDataset(inputs.eval_inputs, split.train, split.train_labels),
        trunk,
        embedder,
        collate_fn=inputs.eval_collate,
    )
    embeddings = torch.nn.functional.normalize(embeddings.float().cpu(), dim=-1)
    labels = labels.cpu()[:, 0]
    proxies = proxies.detach().float().cpu()
    num_classes = proxies.shape[0]
    if proxies.shape[-1] != embeddings.shape[1] or int(labels.max()) >= num_classes:
        return None
    proxies = torch.nn.functional.normalize(proxies.reshape(num_classes, -1, embeddings.shape[1]), dim=-1)
    owner = torch.arange(num_classes).repeat_interleave(proxies.shape[1])
    proxies = proxies.reshape(-1, embeddings.shape[1])
    nearest = torch.full((len(proxies),), float("inf"))
    for start in range(0, len(embeddings), 4096):  # blocks of samples: memory, not a loop over samples
        block, block_labels = embeddings[start : start + 4096], labels[start : start + 4096]
        distances = torch.cdist(proxies, block)
        distances[owner[:, None] != block_labels[None, :]] = float("inf")
        nearest = torch.minimum(nearest, distances.min(dim=1).values)
    if not torch.isfinite(nearest).all():
        return None
    return float(nearest.mean())


def save_embeddings(path, tester, inputs, trunk, embedder):
    """Normalised test embeddings (float16) for the report's figures, written whole or not at all."""
    embeddings, labels = tester.get_all_embeddings(
        inputs.eval_dataset("test"), trunk, embedder, collate_fn=inputs.eval_collate
    )
    with atomic_write(path, "wb", doing="writing the test embeddings") as f:
        np.savez_compressed(
            f, embeddings=embeddings.cpu().numpy().astype(np.float16), labels=labels.cpu().numpy()[:, 0]
        )


def keep_best_models(model_dir, best_epoch):
    """Drop the optimiser states and the latest-epoch copies; keep the best models."""
    for path in Path(model_dir).glob("*.pth"):
        state = path.name.startswith(
            tuple(f"{m}_{k}" for m in MODEL_KEYS for k in ("optimizer", "scheduler"))
        )
        if state or not path.stem.endswith(f"_best{best_epoch}"):
            path.unlink()
