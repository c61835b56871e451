"""The launcher's checks, before anything runs or is written: the config root and the
``--config_*`` options (``check_config_options``), then, with the runner built
(``check_run``), pb's options, the experiment folder's state for what is asked (a new
experiment, a resumed or evaluated one, a reproduction, an optimisation), the configs the
run will load (each file, then merged with the command line's overrides: the classes they
name, ``splits_to_eval``, the search ranges, options that no config has), and the folders,
records and checkpoints the run will use.

Each mistake is one line naming the option, the file or the path: a UsageError (exit 2)
for what the user asked or wrote, a FileFault (exit 1) for the file system and for files
of a run that are not what the run wrote.
"""

import copy
import difflib
import glob
import os
import re
from pathlib import Path

from ..cluster import check_reachable
from ..errors import FileFault, UsageError, writable_folder
from . import files, names
from .runners import PB_OPTIONS

CONFIG_MARKER = "config_foldernames.yaml"
SPLITS = ("train", "val", "test")
TAKEN = (
    "the experiment folder is already taken: continue it with --resume_training latest, evaluate it with "
    "--evaluate / --evaluate_ensemble, or choose another --experiment_name"
)
# pb's flags that continue an experiment from its saved configs and checkpoints
CONTINUING = ("resume_training", "evaluate", "evaluate_ensemble")
INFINITE = float("inf")


# ------------------------------------------------------------------ the config root
def read_config_root(root, option="--root_config_folder"):
    """The config root's ``config_foldernames.yaml``: ``config_foldernames`` (the config
    folders) and, per folder, the default config names; a UsageError naming it otherwise."""
    if not Path(root).is_dir():
        raise UsageError(
            f"argument {option}: {root} is not a folder (a pb config root, see docs/benchmarker.md)"
        )
    path = Path(root) / CONFIG_MARKER
    marker = files.read_yaml(path, "config root file", "a pb config root starts with it", error=UsageError)
    folders = marker.get("config_foldernames")
    if not (isinstance(folders, list) and folders and all(isinstance(f, str) for f in folders)):
        raise UsageError(f"config root file {path}: config_foldernames must be a list of folder names")
    for folder in folders:
        defaults = marker.get(folder)
        if not (isinstance(defaults, list) and all(isinstance(n, str) for n in defaults)):
            raise UsageError(
                f"config root file {path}: {folder} must be a list of config names, got {defaults!r}"
            )
    return marker


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
    folders = read_config_root(config_root)["config_foldernames"]
    for option, config_names in config_options(pb_argv).items():
        if option not in folders:
            raise UsageError(f"unknown option --{option}: the config folders are {', '.join(folders)}")
        if not config_names:
            raise UsageError(f"--{option} needs config names, e.g. --{option} [default]")
        available = sorted(p.stem for p in (Path(config_root) / option).glob("*.yaml"))
        for name in config_names:
            if name not in available:
                raise UsageError(
                    f"--{option}: no config named {name!r} in {Path(config_root) / option} "
                    f"(available: {', '.join(available) or 'none'})"
                )


# ------------------------------------------------------------------ the run
def check_run(args, factory):
    """Everything the run ``args`` (the launcher's options) with ``factory`` (its
    RunnerFactory) will use, before it starts: see the module's docstring."""
    bayes_opt = args.bayes_opt_iters > 0
    check_launcher_combinations(args, bayes_opt)
    runner = factory.single_experiment_runner()
    YR = runner.setup_yaml_reader()  # pb's options, checked (runners.PbArgumentParser)
    pb_args = YR.args
    use_saved = check_experiment_state(pb_args, factory.options["root_experiment_folder"], bayes_opt)
    config_paths, merge_argparse = run_config_paths(runner, pb_args, use_saved, bayes_opt)
    for path in (p for paths in config_paths.values() for p in paths):
        if use_saved and Path(path).is_relative_to(pb_args.place_to_save_configs):
            files.read_yaml(path, "saved config", files.SAVED_CONFIG_ADVICE)
        else:
            files.read_yaml(path, "config file", "fix it", error=UsageError)
    config = load_configs(YR, config_paths, merge_argparse)
    check_options(factory.pb_argv, set(YR.loaded_yaml) | set(pb_args.config_foldernames))
    names.check_config_classes(config, runner.pytorch_getter)
    check_splits(config.get("splits_to_eval"))
    if bayes_opt:
        check_search_space(config, use_saved)
    check_folders(factory.options, pb_args, use_saved and not bayes_opt)


def check_search_space(config, resuming):
    """The search ranges of ``config`` (a new optimisation needs one; a resumed one's
    saved configs are checked by bayes_opt.BayesOptRunner, which names the folder)."""
    from .search_space import take_search_space  # ax: imported for an optimisation only

    if not take_search_space(copy.deepcopy(config)) and not resuming:
        raise UsageError(
            "--bayes_opt_iters needs at least one search range in the configs (a key ending in ~BAYESIAN~, "
            "~LOG_BAYESIAN~ or ~INT_BAYESIAN~), e.g. --config_loss_and_miners [mean_field_contrastive_bayes_opt]"
        )


def check_launcher_combinations(args, bayes_opt):
    """The options of the optimisation's trials need ``--bayes_opt_iters`` (``--trial_gpus``
    also Ray: it would be ignored in this process); a Ray cluster's address must answer
    (cluster.ClusterError)."""
    given = [
        option
        for option, value, default in (
            ("--parallel_trials", args.parallel_trials, 1),
            ("--ray_address", args.ray_address, None),
            ("--trial_gpus", args.trial_gpus, None),
            ("--trial_cpus", args.trial_cpus, None),
        )
        if value != default
    ]
    if given and not bayes_opt:
        raise UsageError(
            f"argument {given[0]}: only with --bayes_opt_iters N (it places the optimisation's trials; "
            "a single experiment runs in this process)"
        )
    if args.trial_gpus is not None and args.parallel_trials == 1 and not args.ray_address:
        raise UsageError(
            "argument --trial_gpus: only with Ray (--parallel_trials > 1 or --ray_address); without Ray the "
            "trials run in this process, which pb puts on the GPU whenever torch sees one"
        )
    if args.reproductions != [0] and not bayes_opt:
        raise UsageError(
            "argument --reproductions: only with --bayes_opt_iters N (it retrains the best trial)"
        )
    if args.ray_address:
        check_reachable(args.ray_address)  # before the optimisation writes its folder


def check_experiment_state(args, root, bayes_opt):
    """Whether the run reads the experiment's saved configs; a UsageError where the
    experiment folder does not hold what the run needs (pb: a traceback), or holds a run
    that a new experiment would overwrite (pb: refused with exit code 0)."""
    saved = os.path.isdir(args.place_to_save_configs)
    if bayes_opt:
        return saved
    if args.reproduce_results and not os.path.isdir(os.path.join(args.reproduce_results, "configs")):
        raise UsageError(
            f"argument --reproduce_results: {args.reproduce_results} is not an experiment folder "
            "(it has no configs folder)"
        )
    flags = [f"--{flag}" for flag in CONTINUING if getattr(args, flag)]
    if flags and not args.reproduce_results:
        if not saved:
            raise UsageError(
                f"argument {flags[0]}: experiment {args.experiment_name!r} has not run in {root} (there is no "
                f"{args.place_to_save_configs}): run it first without {flags[0]}"
            )
        return True
    if folder_taken(args.experiment_folder):
        raise UsageError(TAKEN)
    return False


def folder_taken(folder):
    """pb's rule (FolderCreator.make_dir): a folder with a file in a sub-folder is taken."""
    return any(names_ and path != folder for path, _, names_ in os.walk(folder))


def run_config_paths(runner, args, use_saved, bayes_opt):
    """``({config: [files]}, merge_argparse)``: the config files the run loads, and
    whether the command line's overrides are merged into them, as pb decides."""
    if args.reproduce_results and not bayes_opt:
        paths = runner.get_saved_config_paths(
            args, config_folder=os.path.join(args.reproduce_results, "configs")
        )
        defaults = runner.get_root_config_paths(args)
        for name, files_ in paths.items():
            if not all(os.path.isfile(f) for f in files_):
                paths[name] = defaults[name]  # pb: "Will use default config"
        return paths, runner.merge_argparse_when_resuming
    if use_saved:
        resuming = bayes_opt or args.resume_training
        return runner.get_saved_config_paths(args), runner.merge_argparse_when_resuming if resuming else True
    return runner.get_root_config_paths(args), True


def load_configs(YR, config_paths, merge_argparse):
    """pb's merged configs (a dict), as the run will load them; configs and overrides that
    do not merge are a UsageError."""
    try:
        args, _, _ = YR.load_yamls(
            config_paths=config_paths,
            max_merge_depth=INFINITE,
            max_argparse_merge_depth=INFINITE,
            merge_argparse=merge_argparse,
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:  # pb's merge of user data
        raise UsageError(
            f"the configs and the command line's overrides do not merge ({type(e).__name__}: {e}): check the "
            "~OVERRIDE~ / ~APPLY~ / ~SWAP~ / ~DELETE~ options against the configs"
        ) from None
    return vars(args)


def check_options(pb_argv, config_keys):
    """Every option of pb's part sets something: pb's own options, a config folder, or a
    key of the loaded configs (pb ignores any other, e.g. a misspelt one)."""
    known = set(PB_OPTIONS) | set(config_keys)
    for word in pb_argv:
        if re.match("^--[a-zA-Z]", word) is None:
            continue
        key = word[2:].split("~", 1)[0]
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean --{close[0]}?)" if close else ""
            raise UsageError(
                f"unknown option --{key}: not an option of pml-fieldlosses-pb (see --help) nor of pb, and no "
                f"loaded config has a key {key!r}{hint}"
            )


def check_splits(splits):
    """``splits_to_eval``: a non-empty list of distinct split names."""
    known = isinstance(splits, list) and all(isinstance(s, str) and s in SPLITS for s in splits)
    if not (known and splits and len(set(splits)) == len(splits)):
        raise UsageError(
            f"splits_to_eval: expected a list of distinct splits among {', '.join(SPLITS)} "
            f"(e.g. --splits_to_eval [test]), got {splits!r}"
        )


def check_folders(options, args, continuing):
    """The folders and files the run writes and reads: the experiment root (created, and
    written to), the dataset root, pb's record database; for a run that continues an
    experiment, its records and the checkpoints it loads."""
    root = options["root_experiment_folder"]
    writable_folder(root, "--root_experiment_folder")
    if os.path.exists(args.experiment_folder):
        writable_folder(args.experiment_folder, "--experiment_name")
    for option in ("dataset_root", "pytorch_home"):
        path = options.get(option)
        if path and os.path.exists(path) and not os.path.isdir(path):
            raise FileFault(f"--{option} {path}: it is a file, not a folder: choose another path")
    db = options.get("global_db_path")
    if db:
        if os.path.isdir(db):
            raise FileFault(
                f"--global_db_path {db}: it is a folder, not a database file: choose another path"
            )
        writable_folder(os.path.dirname(os.path.abspath(db)), "--global_db_path's folder")
        files.check_database(db)
    if not continuing:
        return
    for path in sorted(
        glob.glob(os.path.join(glob.escape(args.experiment_folder), "*", "saved_csvs", "logs.db"))
    ):
        files.check_database(path)
    evaluating = bool(args.evaluate or args.evaluate_ensemble)
    best = evaluating or args.resume_training == "best"
    if evaluating and not files.experiment_checkpoints(args.experiment_folder, best=True):
        flag = "--evaluate_ensemble" if args.evaluate_ensemble else "--evaluate"
        raise UsageError(
            f"argument {flag}: experiment {args.experiment_name!r} has no trained model yet (no best "
            f"checkpoint in {args.experiment_folder}): train it first (--resume_training latest)"
        )
    files.check_experiment_checkpoints(args.experiment_folder, best=best)
