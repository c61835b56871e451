"""``pml-fieldlosses-pb``: powerful-benchmarker's examples/run.py with our registrations.

Parses the command line once (``parse``): run.py's own options (below) say which runner to
build and how (runner_factory.py); everything else is pb's experiment options
(``--experiment_name``, ``--config_*``, ``--evaluate``, ``--evaluate_ensemble``,
``--splits_to_eval``, ``--resume_training``, ``--reproduce_results``, config overrides),
which pb's runners read as their command line (runners.py).

A mistake or a fault is one line, never a traceback (``--traceback`` shows it): the
options are checked when they are parsed, the run's configs, folders and files before it
starts (checks.py); a mistake is exit code 2, a file-system fault or a run that fails the
protocol 1, Ctrl-C 130. An error that is none of these is a bug and keeps its traceback.
"""

import argparse
import importlib.metadata
import inspect
import logging
import sqlite3
import sys
from pathlib import Path

from .. import extras
from ..cluster import ClusterError, JobFailed, check_address
from ..cluster_slots import SlotsDoNotFit
from ..errors import ADVICE, FileFault, UsageError, file_fault, float_range, int_range
from . import checks
from .names import UnknownClass
from .protocol import ProtocolError
from .runner_factory import RunnerFactory, import_target
from .runners import check_values, pb_words
from .trials import LOG_FORMAT, SequentialTrials

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


class Parser(argparse.ArgumentParser):
    """argparse with its errors in one line, like the command's own (--help shows the usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser():
    parser = Parser(
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
    parser.add_argument(
        "--bayes_opt_iters",
        type=int_range(0),
        default=0,
        metavar="N",
        help="Bayesian optimisation of the configs' search ranges (~BAYESIAN~ keys) over N trials",
    )
    parser.add_argument(
        "--reproductions",
        type=reproductions,
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
        type=ray_address,
        default=None,
        help="run the trials on this Ray cluster ('auto' or HOST:PORT; default with --parallel_trials > 1: "
        "a new local Ray instance with this machine's resources)",
    )
    parser.add_argument(
        "--trial_gpus",
        type=float_range(0),
        default=None,
        help="GPUs per trial (default 1 if the cluster has GPUs)",
    )
    parser.add_argument(
        "--trial_cpus",
        type=float_range(0, low_open=True),
        default=None,
        help="CPUs per trial, also its torch threads (default: the cluster's CPUs / --parallel_trials, "
        "at most one node's; without Ray: torch's threads, all cores)",
    )
    parser.add_argument(
        "--register",
        action="append",
        default=[],
        metavar="KIND=TARGET",
        help="also register a module or class with pb, e.g. loss=my_package.my_losses or "
        "dataset=my_package.data.MyDataset (kinds: loss, miner, model, dataset, sampler, ...)",
    )
    parser.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    return parser


def reproductions(text):
    """An argparse type: ``--reproductions`` N (runs 0..N-1) or A,B (runs A..B-1), as the
    arguments of ``range``."""
    try:
        bounds = [int(x) for x in text.split(",")]
    except ValueError:
        bounds = []
    if (len(bounds) == 1 and bounds[0] >= 0) or (len(bounds) == 2 and 0 <= bounds[0] <= bounds[1]):
        return bounds
    raise argparse.ArgumentTypeError(f"expected N >= 0 or A,B with 0 <= A <= B, got {text!r}")


def ray_address(text):
    """An argparse type: ``--ray_address`` ('auto', 'local', HOST:PORT, ray://HOST:PORT)."""
    try:
        return check_address(text, "--ray_address")
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None


# the kinds of classes pb looks up by name (PytorchGetter and BaseRunner.init_pytorch_getter)
REGISTER_KINDS = (
    "model", "loss", "miner", "optimizer", "lr_scheduler", "transform", "dataset", "sampler",
    "regularizer", "trainer", "tester", "api_parser", "accuracy_calculator", "split_manager",
    "hook_container", "factory", "aggregator", "ensemble", "visualizer", "distance", "reducer",
    "weight_init_func",
)  # fmt: skip


def parse_registration(spec):
    kind, sep, target = spec.partition("=")
    if not sep or not kind or not target:
        raise UsageError(f"--register expects KIND=TARGET (e.g. loss=my_package.my_losses), got {spec!r}")
    if kind not in REGISTER_KINDS:
        raise UsageError(f"--register {spec}: unknown kind {kind!r} (kinds: {', '.join(REGISTER_KINDS)})")
    try:
        obj = import_target(target)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"--register {spec}: cannot import {target} ({e})") from None
    if not (inspect.ismodule(obj) or inspect.isclass(obj)):
        raise UsageError(f"--register {spec}: {target} is neither a module nor a class")
    return kind, obj


def check_ray_options(args):
    """Ray (the cluster extra) where the options ask for it; the trial counts."""
    if args.parallel_trials < 1:
        raise UsageError(f"argument --parallel_trials must be >= 1, got {args.parallel_trials}")
    if args.parallel_trials > 1 or args.ray_address:
        missing = extras.missing_modules("cluster")
        if missing:
            option = "--ray_address" if args.ray_address else "--parallel_trials"
            raise UsageError(
                f"argument {option}: running on Ray needs {', '.join(missing)}, not installed here: "
                f"{extras.install_hint(['cluster'])}"
            )


def parse(argv):
    """The launcher's command line ``argv``, parsed and checked once: ``(args, factory)``,
    the launcher's options and the RunnerFactory of its runners. (argparse exits with 2 on
    a bad option of the launcher, with 0 after --help.)"""
    args, pb_argv = build_parser().parse_known_args(argv)
    pb_argv = pb_words(pb_argv)
    check_values(pb_argv)
    for spec in args.register:  # checked here; a runner imports the target again by its name
        parse_registration(spec)
    check_ray_options(args)
    try:
        config_root = args.root_config_folder or default_config_root()
    except FileNotFoundError as e:
        raise FileFault(str(e)) from None
    checks.check_config_options(pb_argv, config_root)
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
        reproductions=args.reproductions,
    )
    return args, factory


def trial_executor(args, factory):
    """What runs the optimisation's trials: K = ``--parallel_trials`` warm Ray workers
    (also for K = 1 with ``--ray_address``), else a warm runner in this process, one trial at a
    time, with ``--trial_cpus`` torch threads if given."""
    if args.parallel_trials > 1 or args.ray_address:
        from .parallel import RayTrials

        return RayTrials(
            factory.with_absolute_paths(),
            args.parallel_trials,
            args.ray_address,
            args.trial_gpus,
            args.trial_cpus,
        )
    return SequentialTrials(factory, None if args.trial_cpus is None else max(1, int(args.trial_cpus)))


def make_runner(args, factory):
    """pb's runner of the command line: the Bayesian optimisation with ``--bayes_opt_iters``,
    else one experiment."""
    if args.bayes_opt_iters > 0:
        return factory.bayes_opt_runner(trial_executor(args, factory))
    return factory.single_experiment_runner()


def run(args, factory):
    """The run of the command line, checked first (checks.check_run). pb's only
    ``sys.exit()`` is its refusal to start an experiment in a folder that already holds
    files (logged at INFO, exit 0): a UsageError (fixes experiment_folder_taken_exits_0;
    the checks refuse such a folder before pb)."""
    checks.check_run(args, factory)
    logging.basicConfig(format=LOG_FORMAT)
    logging.getLogger().setLevel(logging.INFO)
    # importing pb logs a line, which gave the root logger Python's default handler (no time
    # stamps) before this: the launcher's lines carry their time whatever handler prints them
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
    try:
        make_runner(args, factory).run()
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
        raise UsageError(checks.TAKEN) from None


# sqlite's words for a database it cannot write or read (record-keeper's records)
DATABASE_FAULTS = (
    "disk is full",
    "readonly",
    "disk I/O error",
    "unable to open",
    "not a database",
    "malformed",
)


def one_line(error, root):
    """``(line, exit code)`` of an error the user can act on; None for a bug."""
    if isinstance(error, JobFailed) and isinstance(error.__cause__, Exception):
        reported = one_line(error.__cause__, root)  # a trial's own error, raised on its Ray worker
        return None if reported is None else (f"{reported[0]} (in a trial on a Ray worker)", reported[1])
    if not error.args and isinstance(error.__context__, Exception):
        return one_line(error.__context__, root)  # pb's bare "raise ValueError" over the error
    if isinstance(error, ProtocolError):
        return f"protocol error: {error}", 1
    if isinstance(error, (UsageError, SlotsDoNotFit, UnknownClass)):
        return f"error: {error}", 2
    if isinstance(error, (FileFault, ClusterError)):
        return f"error: {error}", 1
    if isinstance(error, OSError) and error.filename is not None:
        return f"error: {file_fault(error, error.filename, 'at')}", 1
    if isinstance(error, OSError) and error.errno in ADVICE:  # a write that failed: no file named
        return f"error: {file_fault(error, root, 'writing under --root_experiment_folder')}", 1
    if isinstance(error, sqlite3.Error) and any(words in str(error) for words in DATABASE_FAULTS):
        return (
            f"error: the records under --root_experiment_folder {root}: {error}: free space or fix the permissions",
            1,
        )
    return None


def main(argv=None):
    """The command ``pml-fieldlosses-pb argv``; exits (SystemExit) with the error's code
    after one line on stderr, returns None when the run is done."""
    argv = sys.argv[1:] if argv is None else list(argv)
    show_traceback = "--traceback" in argv
    root = "experiments"
    try:
        args, factory = parse(argv)
        root = args.root_experiment_folder
        run(args, factory)
    except KeyboardInterrupt:
        if show_traceback:
            raise
        print(
            "\npml-fieldlosses-pb: interrupted: what finished is kept; run the same command again to go on "
            "(a single experiment: with --resume_training latest)",
            file=sys.stderr,
        )
        sys.exit(130)
    except Exception as e:
        reported = None if show_traceback else one_line(e, root)
        if reported is None:
            raise
        line, code = reported
        print(f"pml-fieldlosses-pb: {' '.join(line.split())}", file=sys.stderr)
        sys.exit(code)
