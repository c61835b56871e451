"""Wall time of one Bayesian-optimisation sweep with 1 trial in flight and with K (Ray).

    python benchmarks/bench_parallel_sweep.py                 # K = 1 and 2 (CPU) or the GPU count
    python benchmarks/bench_parallel_sweep.py --parallel 1 2 4 --trials 8 --epochs 6

The same sweep (MeanFieldContrastive's search space, --trials trials of --folds folds x
--epochs epochs of --iterations iterations of batch 32, every epoch trained (no early stop),
no reproduction) on the real 48-class emoji subset as frozen EfficientNet-Lite0 features
(built into the bench's cache before the first timing, so no sweep pays for it), through
``pml-fieldlosses-pb`` in a fresh experiment folder per setting. K = 1 runs as without Ray
(the trials one after another on a warm runner in the launcher's process, torch with all its
threads or --threads); K > 1 runs the trials on K warm Ray workers (the same warm runner), each
with its share of the CPUs as torch threads.

Runs each K --repeats times in alternating order (1 2 2 1 ...: a change in the load of a
shared machine weighs on every K alike) and prints each run's wall time, the machine's load
average before and after it, and where the time went, read from the launcher's log: the start
before the first trial (imports, configs, ax; with Ray also Ray's start), the runners' own
start-up (imports and runner build; on Ray once Ray has started the workers' processes), the
trials' mean duration, each timed on its runner in either case (the first trial on each runner,
which loads the data, apart from the others), the trial-seconds per wall-second while the trials
ran (the parallelism obtained; for K = 1 the share of the time the driver leaves to the trials),
and the end (best parameters, test evaluation, plots); then the speed-up of each K over K = 1
(the ratio of the median wall times, and per repeat). Checks that every trial trained every
epoch of every fold. Needs the pb and cluster extras.

No --device/--autocast (the other scripts' benchmarks/device.py options): pb 0.9.33 has no
device setting (its runners train on CUDA whenever torch sees a GPU, else on the CPU) and no
autocast; on a machine with GPUs the default K is the GPU count, one GPU per Ray worker.
--wait-policy sets OMP_WAIT_POLICY for every sweep: OpenMP's default, spinning threads, makes
torch's 2 threads many times slower than 1 on cores that other jobs share (see docs/cluster.md).
"""

import argparse
import datetime
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import closing

DATA = [
    "--config_dataset", "[default,", "emoji_features]",
    "--dataset~APPLY~2", "{vendors:", "[google,", "twitter],", "num_classes:", "48}",
    "--config_general", "[default,", "quick]",
    "--config_eval", "[default,", "quick]",
    "--config_models", "[default,", "emoji_features]",
    "--config_loss_and_miners", "[mean_field_contrastive_bayes_opt]",
    "--config_optimizers", "[default,", "emoji_features,", "with_metric_loss_optimizer_bayes_opt]",
    "--reproductions", "0",
]  # fmt: skip
BATCH = 32
LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ \w+: (.*)$")
VAL = "accuracies_normalized_GlobalEmbeddingSpaceTester_level_0_VAL_vs_self"


def training(epochs, iterations, folds):
    return [
        "--num_epochs_train", str(epochs), "--patience", str(epochs + 1),
        "--trainer~APPLY~2", "{iterations_per_epoch:", f"{iterations}}}",
        "--sampler~APPLY~2", "{length_before_new_iter:", f"{iterations * BATCH}}}",
        "--split_manager~APPLY~2", "{num_training_sets:", f"{folds}}}",
    ]  # fmt: skip


def sweep(folder, trials, parallel, train, threads=None, wait_policy=None):
    command = [sys.executable, "-m", "pml_fieldlosses.app.benchmarker", "--root_experiment_folder", folder,
               "--experiment_name", "sweep", *DATA, *train,
               "--bayes_opt_iters", str(trials), "--parallel_trials", str(parallel)]  # fmt: skip
    # K = 1 uses torch's default threads (all cores); Ray workers get theirs from the launcher
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads is not None and parallel == 1:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    if wait_policy is not None:
        env["OMP_WAIT_POLICY"] = wait_policy
    log_path = os.path.join(folder, "log.txt")
    started = time.time()
    with open(log_path, "w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder, check=False)
    wall = time.time() - started
    with open(log_path) as log:
        text = log.read()
    if done.returncode:
        sys.exit(f"the sweep with {parallel} in flight failed:\n{text[-5000:]}")
    return wall, started, text


def events(text):
    """(seconds since the epoch, message) of the launcher's log lines."""
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            stamp = datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            yield stamp, match[2]


def breakdown(text, started, trials):
    """Where the time went (seconds), from the log."""
    log = list(events(text))

    def first(pattern):
        for stamp, message in log:
            match = re.match(pattern, message)
            if match:
                return stamp, match
        raise ValueError(f"no log line matches {pattern!r}")

    begun = {
        int(m[1]): t for t, m in ((t, re.match(r"Optimization iteration (\d+)$", s)) for t, s in log) if m
    }
    done_at, _ = first(r"DONE BAYESIAN OPTIMIZATION")
    end, _ = first(r"##### FINISHED #####")
    parts = {"start": begun[0] - started, "end": end - done_at}
    # every trial is timed on its runner (in the launcher's process for K = 1, on its Ray
    # worker for K > 1), without the driver's work between trials (ax, records, plots)
    durations = {
        int(m[1]): float(m[2])
        for m in re.finditer(r"Optimization iteration (\d+) finished \(([\d.]+) s", text)
    }
    if sorted(durations) != list(range(trials)):
        raise ValueError(f"trials timed: {sorted(durations)}, expected 0..{trials - 1}")
    ray = re.search(r"Ray: connected in ([\d.]+) s", text)
    parts["ray"] = float(ray[1]) if ray else 0.0
    startups = [
        float(m)
        for m in re.findall(r"(?:Ray: a worker started|The trial runner was built) in ([\d.]+) s", text)
    ]
    parts["worker_start"] = sum(startups) / len(startups)
    firsts = sorted(durations)[: len(startups)]  # the first trial on each runner
    later = [d for i, d in durations.items() if i not in firsts]
    parts["first_trial"] = sum(durations[i] for i in firsts) / len(firsts)
    parts["trial"] = sum(later) / len(later) if later else float("nan")
    parts["concurrency"] = sum(durations.values()) / (done_at - begun[0])
    return parts


def check_trained(folder, trials, epochs, folds):
    for trial in range(trials):
        for fold in range(folds):
            db = os.path.join(
                folder, "sweep", f"sweep{trial}", f"Test50_50_Partitions4_{fold}", "saved_csvs", "logs.db"
            )
            with closing(sqlite3.connect(db)) as connection:
                trained = [r[0] for r in connection.execute(f"SELECT epoch FROM {VAL} ORDER BY id")]
            if trained != list(range(-1, epochs + 1)):
                sys.exit(f"trial {trial} fold {fold} evaluated epochs {trained}, expected -1..{epochs}")


def default_parallel():
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        gpus = 0
    return [1, gpus] if gpus > 1 else [1, 2]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--parallel", type=int, nargs="+", default=default_parallel())
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=100, help="iterations (batches of 32) per epoch")
    parser.add_argument("--folds", type=int, default=2, choices=range(1, 5))
    parser.add_argument("--repeats", type=int, default=2, help="runs of each K, in alternating order")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch threads of the K = 1 runs (default: torch's own, all cores); e.g. 1 to tell the "
        "gain of running trials side by side from the cost of torch's threads on busy cores",
    )  # fmt: skip
    parser.add_argument(
        "--wait-policy", choices=["active", "passive"], default=None,
        help="OMP_WAIT_POLICY of every sweep (default: the environment's; OpenMP's default spins): "
        "passive tells the cost of torch's threads spinning on cores that other jobs share",
    )  # fmt: skip
    args = parser.parse_args()
    train = training(args.epochs, args.iterations, args.folds)
    with tempfile.TemporaryDirectory() as warm_up:
        sweep(warm_up, 1, 1, training(1, 10, 1))  # builds the data subset and its features into the cache
    print(f"{args.trials} trials of {args.folds} folds x {args.epochs} epochs x {args.iterations} iterations, "
          f"{os.cpu_count()} CPUs, K = 1 with {args.threads or 'all'} torch threads, "
          f"OMP_WAIT_POLICY {args.wait_policy or os.environ.get('OMP_WAIT_POLICY', 'unset')}; seconds:")  # fmt: skip
    print(f"{'K':>3} {'wall':>7} | {'start':>6} {'ray':>5} {'worker':>6} {'1st trial':>9} {'trial':>6} "
          f"{'trials/s':>8} {'end':>5} | load before/after")  # fmt: skip
    walls = {k: [] for k in args.parallel}
    for repeat in range(args.repeats):
        # in turn, then in the reverse order (1 2 2 1 ...): a change in the machine's load
        # during the run weighs on every K alike
        for k in args.parallel if repeat % 2 == 0 else reversed(args.parallel):
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory() as folder:
                wall, started, text = sweep(folder, args.trials, k, train, args.threads, args.wait_policy)
                check_trained(folder, args.trials, args.epochs, args.folds)
            walls[k].append(wall)
            p = breakdown(text, started, args.trials)
            print(f"{k:>3} {wall:7.1f} | {p['start']:6.1f} {p.get('ray', 0):5.1f} {p.get('worker_start', 0):6.1f} "
                  f"{p['first_trial']:9.1f} {p['trial']:6.1f} {p['concurrency']:8.2f} {p['end']:5.1f} | "
                  f"{load:4.1f} / {os.getloadavg()[0]:4.1f}", flush=True)  # fmt: skip
    print(
        "start: launch to the first trial (with Ray: includes ray); ray: Ray's start; worker: a runner's "
        "imports and build (K = 1: in the launcher's process; K > 1: on a Ray worker, after Ray has "
        "started its process, not timed); 1st trial: the first trial on a runner (loads the data); "
        "trial: mean of the others, each timed on its runner; trials/s: trial-seconds per wall-second "
        "while trials ran (K = 1: below 1 by the driver's ax, records and plots between trials); end: "
        "best parameters, test evaluation, plots; load: the machine's 1-minute load average."
    )
    base = args.parallel[0]
    for k in args.parallel[1:]:
        pairs = " ".join(f"{b / w:.2f}x" for b, w in zip(walls[base], walls[k]))
        print(f"K = {k} vs K = {base}: speed-up {statistics.median(walls[base]) / statistics.median(walls[k]):.2f}x "
              f"(median walls {statistics.median(walls[base]):.1f} s / {statistics.median(walls[k]):.1f} s; "
              f"per repeat {pairs})")  # fmt: skip


if __name__ == "__main__":
    main()
