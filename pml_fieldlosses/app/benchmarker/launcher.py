"""``pml-fieldlosses-pb``: powerful-benchmarker's examples/run.py with our registrations.

Parses the command line once (``parse``): run.py's own options (below) say which runner to
build and how (runner_factory.py); everything else is pb's experiment options
(``--experiment_name``, ``--config_*``, ``--evaluate``, ``--evaluate_ensemble``,
``--splits_to_eval``, ``--resume_training``, ``--reproduce_results``, config overrides),
which pb's runners read as their command line (runners.py).
"""

import argparse
import importlib.metadata
import inspect
import logging
import sys
from pathlib import Path

import yaml

from ..cluster_slots import SlotsDoNotFit
from .protocol import ProtocolError
from .runner_factory import RunnerFactory, import_target
from .trials import SequentialTrials

CONFIG_MARKER = "config_foldernames.yaml"
DATA_FILES_CONFIG_ROOT = "share/pml-fieldlosses/configs"


def default_config_root():
    """Our pb config root: ``configs/`` of a source checkout (also an editable install),
    else the copy a regular install puts under ``share/pml-fieldlosses/configs``."""
    checkout = Path(__file__).resolve().parents[3] / "configs"
    if (checkout / CONFIG_MARKER).is_file():
        return str(checkout)
    try:
        files = importlib.metadata.files("pml-fieldlosses") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if str(f).replace("\\", "/").endswith(f"{DATA_FILES_CONFIG_ROOT}/{CONFIG_MARKER}"):
            return str(Path(f.locate()).resolve().parent)
    raise FileNotFoundError(
        "pml-fieldlosses' pb config root was not found (neither a source checkout's configs/ nor an "
        f"installed {DATA_FILES_CONFIG_ROOT}); pass --root_config_folder"
    )


def build_parser():
    parser = argparse.ArgumentParser(
        prog="pml-fieldlosses-pb",
        allow_abbrev=False,
        description="Run powerful-benchmarker 0.9.33 (MLRC protocol) with pml-fieldlosses' losses, "
        "models and datasets registered. Options not listed here go to pb (--experiment_name, "
        "--config_*, --evaluate, --evaluate_ensemble, --splits_to_eval, --resume_training, ...).",
    )
    parser.add_argument("--pytorch_home", type=str, default=None)
    parser.add_argument("--dataset_root", type=str, default="datasets")
    parser.add_argument("--root_experiment_folder", type=str, default="experiments")
    parser.add_argument("--global_db_path", type=str, default=None)
    parser.add_argument("--merge_argparse_when_resuming", default=False, action="store_true")
    parser.add_argument(
        "--root_config_folder", type=str, default=None, help="pb config root (default: ours, configs/)"
    )
    parser.add_argument("--bayes_opt_iters", type=int, default=0)
    parser.add_argument(
        "--reproductions",
        type=str,
        default="0",
        help="after Bayesian optimisation, retrain the best configuration: N runs (0..N-1) or 'A,B' for A..B-1",
    )
    parser.add_argument(
        "--parallel_trials",
        type=int,
        default=1,
        help="Bayesian optimisation: trials (and reproductions) in flight at once, each on one of as "
        "many warm Ray workers (needs the cluster extra; see docs/cluster.md)",
    )
    parser.add_argument(
        "--ray_address",
        type=str,
        default=None,
        help="run the trials on this Ray cluster ('auto' or HOST:PORT; default with --parallel_trials > 1: "
        "a new local Ray instance with this machine's resources)",
    )
    parser.add_argument(
        "--trial_gpus", type=float, default=None, help="GPUs per trial (default 1 if the cluster has GPUs)"
    )
    parser.add_argument(
        "--trial_cpus",
        type=float,
        default=None,
        help="CPUs per trial, also its torch threads (default: the cluster's CPUs / --parallel_trials, "
        "at most one node's)",
    )
    parser.add_argument(
        "--register",
        action="append",
        default=[],
        metavar="KIND=TARGET",
        help="also register a module or class with pb, e.g. loss=my_package.my_losses or "
        "dataset=my_package.data.MyDataset (kinds: loss, miner, model, dataset, sampler, ...)",
    )
    return parser


def parse_registration(spec):
    kind, sep, target = spec.partition("=")
    if not sep or not kind or not target:
        raise UsageError(f"--register expects KIND=TARGET (e.g. loss=my_package.my_losses), got {spec!r}")
    try:
        obj = import_target(target)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"--register {spec}: cannot import {target} ({e})") from None
    if not (inspect.ismodule(obj) or inspect.isclass(obj)):
        raise UsageError(f"--register {spec}: {target} is neither a module nor a class")
    return kind, obj


def config_options(pb_argv):
    """{folder: [names]} of the ``--config_<folder> [a, b]`` options in pb's arguments (as
    the shell splits them: "[a," "b]")."""
    options, current = {}, None
    for token in pb_argv:
        if token.startswith("--"):
            current = token[2:] if token.startswith("--config_") else None
            if current is not None:
                options[current] = []
        elif current is not None:
            options[current] += [n for n in token.strip("[]").replace(",", " ").split() if n]
    return options


def check_config_options(pb_argv, config_root):
    """Unknown ``--config_*`` folders and config names are usage errors (pb would ignore
    the first and fall back to other configs, or fail later with a traceback)."""
    folders = yaml.safe_load((Path(config_root) / CONFIG_MARKER).read_text())["config_foldernames"]
    for option, names in config_options(pb_argv).items():
        if option not in folders:
            raise UsageError(f"unknown option --{option}: the config folders are {', '.join(folders)}")
        if not names:
            raise UsageError(f"--{option} needs config names, e.g. --{option} [default]")
        available = sorted(p.stem for p in (Path(config_root) / option).glob("*.yaml"))
        for name in names:
            if name not in available:
                raise UsageError(
                    f"--{option}: no config named {name!r} in {Path(config_root) / option} "
                    f"(available: {', '.join(available)})"
                )


class UsageError(ValueError):
    """A mistake on the command line: printed as one line, exit code 2."""


def parse(argv):
    """The launcher's command line ``argv``, parsed and checked once: ``(args, factory)``,
    the launcher's options and the RunnerFactory of its runners."""
    args, pb_argv = build_parser().parse_known_args(argv)
    for spec in args.register:  # checked here; a runner imports the target again by its name
        parse_registration(spec)
    config_root = args.root_config_folder or default_config_root()
    check_config_options(pb_argv, config_root)
    if args.parallel_trials < 1:
        raise UsageError(f"--parallel_trials must be >= 1, got {args.parallel_trials}")
    options = {
        "dataset_root": args.dataset_root,
        "root_experiment_folder": args.root_experiment_folder,
        "pytorch_home": args.pytorch_home,
        "root_config_folder": config_root,
        "global_db_path": args.global_db_path,
        "merge_argparse_when_resuming": args.merge_argparse_when_resuming,
    }
    factory = RunnerFactory(
        options,
        pb_argv,
        registrations=[tuple(spec.split("=", 1)) for spec in args.register],
        bayes_opt_iters=args.bayes_opt_iters,
        reproductions=[int(x) for x in args.reproductions.split(",")],
    )
    return args, factory


def trial_executor(args, factory):
    """What runs the optimisation's trials: K = ``--parallel_trials`` warm Ray workers
    (also for K = 1 with ``--ray_address``), else this process, one trial at a time."""
    if args.parallel_trials > 1 or args.ray_address:
        from .parallel import RayTrials

        return RayTrials(
            factory.with_absolute_paths(),
            args.parallel_trials,
            args.ray_address,
            args.trial_gpus,
            args.trial_cpus,
        )
    return SequentialTrials(factory)


def make_runner(args, factory):
    """pb's runner of the command line: the Bayesian optimisation with ``--bayes_opt_iters``,
    else one experiment."""
    if args.bayes_opt_iters > 0:
        return factory.bayes_opt_runner(trial_executor(args, factory))
    return factory.single_experiment_runner()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    logging.getLogger().setLevel(logging.INFO)
    try:
        args, factory = parse(argv)
        make_runner(args, factory).run()
    except (UsageError, SlotsDoNotFit) as e:
        print(f"pml-fieldlosses-pb: error: {e}", file=sys.stderr)
        sys.exit(2)
    except ProtocolError as e:
        sys.exit(f"pml-fieldlosses-pb: protocol error: {e}")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
        # fixes experiment_folder_taken_exits_0: pb's only sys.exit() is its refusal to
        # start an experiment in a folder that already holds files (logged at INFO, exit 0)
        print(
            "pml-fieldlosses-pb: error: the experiment folder is already taken: continue it with "
            "--resume_training latest, evaluate it with --evaluate / --evaluate_ensemble, or choose "
            "another --experiment_name",
            file=sys.stderr,
        )
        sys.exit(2)
