"""Wall time of one Bayesian-optimisation sweep with 1 trial in flight and with K (Ray).

    python benchmarks/bench_parallel_sweep.py                 # K = 2 (CPU) or the GPU count
    python benchmarks/bench_parallel_sweep.py --parallel 1 2 4 --trials 8

The same sweep (MeanFieldContrastive's search space, --trials trials of 2 folds x 2 short
epochs, no reproduction) on the real 48-class emoji subset as frozen EfficientNet-Lite0
features (built into the bench's cache before the first timing, so no sweep pays for it),
through ``pml-fieldlosses-pb`` in a fresh experiment folder per setting; prints each wall time
and its ratio to K = 1, measured in this one run. Needs the pb and cluster extras.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

SWEEP = [
    "--experiment_name", "sweep",
    "--config_dataset", "[default,", "emoji_features]",
    "--dataset~APPLY~2", "{vendors:", "[google,", "twitter],", "num_classes:", "48}",
    "--config_general", "[default,", "quick]",
    "--config_eval", "[default,", "quick]",
    "--sampler~APPLY~2", "{length_before_new_iter:", "320}",
    "--config_models", "[default,", "emoji_features]",
    "--split_manager~APPLY~2", "{num_training_sets:", "2}",
    "--config_loss_and_miners", "[mean_field_contrastive_bayes_opt]",
    "--config_optimizers", "[default,", "emoji_features,", "with_metric_loss_optimizer_bayes_opt]",
    "--reproductions", "0",
]  # fmt: skip


def sweep(folder, trials, parallel):
    command = [sys.executable, "-m", "pml_fieldlosses.benchmarker", "--root_experiment_folder", folder,
               *SWEEP, "--bayes_opt_iters", str(trials), "--parallel_trials", str(parallel)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread per trial: the trials share the cores
    start = time.perf_counter()
    with open(os.path.join(folder, "log.txt"), "w") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder, check=True)
    return time.perf_counter() - start


def default_parallel():
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        gpus = 0
    return [1, gpus] if gpus > 1 else [1, 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--parallel", type=int, nargs="+", default=default_parallel())
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as warm_up:
        sweep(warm_up, 1, 1)  # builds the data subset and its features into the cache
    times = {}
    for k in args.parallel:
        with tempfile.TemporaryDirectory() as folder:
            times[k] = sweep(folder, args.trials, k)
        print(f"{args.trials} trials, {k} in flight: {times[k]:7.1f} s   "
              f"speed-up vs 1: {times[min(times)] / times[k]:.2f}x", flush=True)


if __name__ == "__main__":
    main()
