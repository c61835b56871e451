"""One (loss, seed) run with PML's trainer, tester and logging hooks, and the
loop over all runs that keeps finished results (a killed benchmark resumes)."""

import contextlib
import json
import logging
import multiprocessing
import random
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import torch
import tqdm
from pytorch_metric_learning import samplers, testers, trainers
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import logging_presets

from . import metrics
from .protocol import number_of_workers, training_labels
from .registry import get_entry

UNTRAINED = "(no training)"
MODEL_KEYS = ("trunk", "embedder", "metric_loss")


class BenchTrainer(trainers.MetricLossOnly):
    """PML's MetricLossOnly with one progress bar per run (over epochs, showing
    the validation MAP@R) instead of one bar per epoch, and the wall seconds of
    each epoch's training iterations (validation excluded)."""

    def __init__(self, *args, progress=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.progress = progress
        self.epoch_seconds = []
        self.epoch_losses = []

    def train(self, start_epoch=1, num_epochs=1):
        self.initialize_dataloader()
        for self.epoch in range(start_epoch, num_epochs + 1):
            self.set_to_train()
            start, total = time.perf_counter(), 0.0
            for self.iteration in range(self.iterations_per_epoch):  # noqa: B020 (as PML's loop)
                self.forward_and_backward()
                total += self.losses["total_loss"].detach().item()
                self.end_of_iteration_hook(self)
                self.step_lr_schedulers(end_of_epoch=False)
            self.epoch_seconds.append(time.perf_counter() - start)
            self.epoch_losses.append(total / self.iterations_per_epoch)
            self.step_lr_schedulers(end_of_epoch=True)
            self.zero_losses()
            keep_going = self.end_of_epoch_hook(self)
            if self.progress is not None:
                self.progress.update(1)
                self.progress.set_postfix(loss=f"{self.epoch_losses[-1]:.3g}")
            if keep_going is False:
                break


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)  # PML's samplers draw from numpy's global generator
    torch.manual_seed(seed)


@contextlib.contextmanager
def run_log(path):
    """Send what PML writes during a run (its per-batch progress bars, warnings,
    log lines) to the run's log file, keeping the terminal for our progress bars."""
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


def make_tester(hooks=None):
    return testers.GlobalEmbeddingSpaceTester(
        normalize_embeddings=True,
        batch_size=512,
        dataloader_num_workers=0,
        data_device=torch.device("cpu"),
        accuracy_calculator=metrics.accuracy_calculator(),
        end_of_testing_hook=None if hooks is None else hooks.end_of_testing_hook,
    )


def write_json(path, value):
    tmp = Path(path).with_suffix(".part")
    tmp.write_text(json.dumps(value, indent=1))
    tmp.replace(path)


def save_embeddings(path, tester, inputs, trunk, embedder):
    """Normalised test embeddings (float16) for the report's figures."""
    dataset = inputs.eval_dataset("test")
    embeddings, labels = tester.get_all_embeddings(dataset, trunk, embedder, collate_fn=inputs.eval_collate)
    np.savez_compressed(
        path, embeddings=embeddings.cpu().numpy().astype(np.float16), labels=labels.cpu().numpy()[:, 0]
    )


def train_one(loss_name, seed, inputs, config, run_dir, tensorboard_dir, file=None, test=True):
    """Train ``loss_name`` with ``seed``, select the epoch by validation MAP@R
    (early stopping), test that model once (unless ``test`` is False: the
    hyperparameter selection never looks at the test split). Returns the result dict."""
    entry = get_entry(loss_name)
    device = torch.device(config.device)
    run_dir, model_dir = Path(run_dir), Path(run_dir) / "models"
    split = inputs.split
    C, D, F = split.num_train_classes, config.embedding_size, inputs.in_features
    start = time.perf_counter()
    seed_everything(seed)
    labels, changed = training_labels(split, config.label_noise, seed)
    # small data sets: at most m samples of every training class in a batch
    batch_size = min(config.batch_size, config.m_per_class * C)

    trunk = inputs.make_trunk().to(device)
    embedder = entry.make_embedder(F, D).to(device)
    loss = entry.build(C, D, embedder).to(device)
    miner = entry.miner() if entry.miner else None
    # an AdamW, a StepLR and a gradient clipper for each trained part, under PML's key names
    lrs = {"embedder": config.lr}
    if any(p.requires_grad for p in trunk.parameters()):
        lrs["trunk"] = config.lr * inputs.trunk_lr_multiplier
    if list(loss.parameters()):
        lrs["metric_loss"] = config.lr * config.loss_lr_multiplier
    models = {"trunk": trunk, "embedder": embedder, "metric_loss": loss}
    optimizers, schedulers, clippers = {}, {}, {}
    for name, lr in lrs.items():
        optimizer = torch.optim.AdamW(models[name].parameters(), lr, weight_decay=config.weight_decay)
        optimizers[f"{name}_optimizer"] = optimizer
        schedulers[f"{name}_scheduler_by_epoch"] = torch.optim.lr_scheduler.StepLR(
            optimizer, config.lr_decay_epochs, config.lr_decay
        )
        if config.grad_clip:
            clippers[name] = GradClipper(models[name].parameters(), config.grad_clip)

    record_keeper, _, writer = logging_presets.get_record_keeper(
        str(run_dir / "records"), str(tensorboard_dir)
    )
    hooks = logging_presets.get_hook_container(record_keeper, primary_metric=metrics.PRIMARY, log_freq=10)
    tester = make_tester(hooks)
    splits = [("val", ["val"])]
    end_of_epoch = hooks.end_of_epoch_hook(
        tester,
        {"val": inputs.eval_dataset("val")},
        str(model_dir),
        test_interval=1,
        patience=config.patience,
        splits_to_eval=splits,
        test_collate_fn=inputs.eval_collate,
    )
    desc = f"{loss_name} seed {seed}"
    with tqdm.tqdm(total=config.epochs, desc=desc, unit="epoch", leave=False, file=file) as progress:
        trainer = BenchTrainer(
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
            lr_schedulers=schedulers,
            gradient_clippers={f"{name}_grad_clipper": c for name, c in clippers.items()},
            end_of_iteration_hook=hooks.end_of_iteration_hook,
            end_of_epoch_hook=end_of_epoch,
            progress=progress,
        )
        trainer.train(num_epochs=config.epochs)
    best_epoch, best_val = hooks.get_best_epoch_and_accuracy(tester, "val")
    history = hooks.get_accuracy_history(tester, "val", return_all_metrics=True)
    results = None
    if test:
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
    if writer is not None:
        writer.close()
    keep_best_models(model_dir, best_epoch)
    return {
        "loss": loss_name,
        "origin": entry.origin,
        "seed": seed,
        "test": results,
        "best_epoch": int(best_epoch),
        "best_val_map_at_r": float(best_val),
        "epochs_run": len(trainer.epoch_seconds),
        "epoch_seconds": trainer.epoch_seconds,
        "seconds_per_epoch": float(np.mean(trainer.epoch_seconds)),
        "epoch_losses": trainer.epoch_losses,
        "val_history": {
            "epoch": [int(e) for e in history["epoch"]],
            "map_at_r": [float(v) for v in history[f"{metrics.PRIMARY}_level0"]],
        },
        "label_noise": {"fraction": config.label_noise, "changed": len(changed), "of": len(labels)},
        "clipped_fraction": {name: c.clipped_fraction() for name, c in clippers.items()},
        "run_seconds": time.perf_counter() - start,
    }


class GradClipper:
    """Clips the gradient norm of ``parameters`` to ``max_norm`` (PML trainers call
    it between backward and the optimiser step) and counts the steps it clipped."""

    def __init__(self, parameters, max_norm):
        self.parameters = [p for p in parameters if p.requires_grad]
        self.max_norm = max_norm
        self.steps = self.clipped = 0

    def __call__(self):
        norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.max_norm)
        self.steps += 1
        self.clipped += int(norm > self.max_norm)

    def clipped_fraction(self):
        return self.clipped / self.steps if self.steps else 0.0


def keep_best_models(model_dir, best_epoch):
    """Drop the optimiser states and the latest-epoch copies; keep the best models."""
    for path in Path(model_dir).glob("*.pth"):
        state = path.name.startswith(
            tuple(f"{m}_{k}" for m in MODEL_KEYS for k in ("optimizer", "scheduler"))
        )
        if state or not path.stem.endswith(f"_best{best_epoch}"):
            path.unlink()


def untrained_test_embeddings(inputs, config, seed=0):
    """(embeddings, labels) of the test split for the untrained row's model of ``seed``."""
    seed_everything(seed)
    trunk = inputs.make_trunk().to(torch.device(config.device))
    embeddings, labels = make_tester().get_all_embeddings(
        inputs.eval_dataset("test"), trunk, torch.nn.Identity(), collate_fn=inputs.eval_collate
    )
    return embeddings.cpu().numpy(), labels.cpu().numpy()[:, 0]


def evaluate_untrained(seed, inputs, config):
    """The trunk with no training and no embedder (for a frozen backbone: its
    standardised features), evaluated like a trained model."""
    start = time.perf_counter()
    seed_everything(seed)
    trunk = inputs.make_trunk().to(torch.device(config.device))
    tester = make_tester()
    data = {"val": inputs.eval_dataset("val"), "test": inputs.eval_dataset("test")}
    tester.test(
        data, 0, trunk, torch.nn.Identity(), [("val", ["val"]), ("test", ["test"])], inputs.eval_collate
    )
    val = metrics.level0(tester.all_accuracies["val"])
    return {
        "loss": UNTRAINED,
        "origin": "baseline",
        "seed": seed,
        "test": metrics.level0(tester.all_accuracies["test"]),
        "best_epoch": 0,
        "best_val_map_at_r": val[metrics.PRIMARY],
        "epochs_run": 0,
        "epoch_seconds": [],
        "seconds_per_epoch": float("nan"),
        "epoch_losses": [],
        "val_history": {"epoch": [0], "map_at_r": [val[metrics.PRIMARY]]},
        "label_noise": {"fraction": config.label_noise, "changed": 0, "of": 0},
        "run_seconds": time.perf_counter() - start,
    }


def execute_run(name, seed, inputs, config, out_dir, file=None, test=True):
    """Run one job into its fresh folder and write its result.json last (so a
    folder without one is an unfinished run). Training is single-threaded:
    every run is timed under the same conditions, tiny ops do not suffer from
    thread contention, and the cores are used by running jobs side by side."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_dir = run_folder(out_dir, name, seed)
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        with run_log(run_dir / "log.txt"):
            if name == UNTRAINED:
                result = evaluate_untrained(seed, inputs, config)
            else:
                tensorboard_dir = Path(out_dir) / "tensorboard" / safe_name(name) / f"seed{seed}"
                shutil.rmtree(tensorboard_dir, ignore_errors=True)
                result = train_one(name, seed, inputs, config, run_dir, tensorboard_dir, file, test)
        write_json(run_dir / "result.json", result)
        return result
    finally:
        torch.set_num_threads(threads)


# what forked workers read (copy-on-write) instead of receiving pickled tensors
_SHARED = {}


def _execute_shared(job):
    return execute_run(*job, _SHARED["inputs"], _SHARED["config"], _SHARED["out_dir"], test=_SHARED["test"])


def run_all(inputs, config, out_dir, file=None, jobs=None, test=True):
    """Every (loss, seed) of ``config`` (seed-major: all losses with seed 0
    first), with the untrained rows, or the (loss, seed) ``jobs`` given. A run
    whose result.json exists is loaded, not recomputed; a run folder without one
    (a killed run) starts afresh. Runs go to ``number_of_workers`` processes.
    ``test=False``: no test evaluation. Returns the result dicts."""
    out_dir = Path(out_dir)
    if jobs is None:
        jobs = [(name, seed) for seed in range(config.seeds) for name in (UNTRAINED, *config.losses)]
    results, todo = [], []
    for name, seed in jobs:
        path = run_folder(out_dir, name, seed) / "result.json"
        if path.is_file():
            results.append(json.loads(path.read_text()))
        else:
            todo.append((name, seed))
    if len(todo) < len(jobs):
        print(
            f"resuming: {len(jobs) - len(todo)} of {len(jobs)} runs already finished in {out_dir}", file=file
        )
    if not todo:
        return _in_order(results, jobs)
    workers = number_of_workers(config, len(todo))
    with tqdm.tqdm(total=len(todo), desc=f"runs ({workers} in parallel)", unit="run", file=file) as bar:
        if workers == 1:
            for name, seed in todo:
                bar.set_postfix_str(f"{name} seed {seed}")
                results.append(execute_run(name, seed, inputs, config, out_dir, file, test))
                bar.update(1)
            return _in_order(results, jobs)
        tqdm.tqdm.monitor_interval = 0  # no monitor thread: nothing threaded to fork
        _SHARED.update(inputs=inputs, config=config, out_dir=out_dir, test=test)
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
        try:
            futures = {pool.submit(_execute_shared, job): job for job in todo}
            for future in as_completed(futures):
                result = future.result()
                results.append(result)
                bar.update(1)
                split, value = (
                    ("val", result["best_val_map_at_r"])
                    if result["test"] is None
                    else ("test", result["test"][metrics.PRIMARY])
                )
                bar.set_postfix_str(f"{result['loss']} seed {result['seed']}: {split} MAP@R {value:.3f}")
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            pool.shutdown(wait=True)
            _SHARED.clear()
    return _in_order(results, jobs)


def _in_order(results, jobs):
    order = {job: i for i, job in enumerate(jobs)}
    return sorted(results, key=lambda r: order[(r["loss"], r["seed"])])


def safe_name(name):
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name).strip("_") or "run"


def run_folder(out_dir, name, seed):
    return Path(out_dir) / "runs" / safe_name(name) / f"seed{seed}"
