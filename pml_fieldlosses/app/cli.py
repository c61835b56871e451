"""The ``pml-fieldlosses`` command.

pml-fieldlosses bench                     # every loss, 3 seeds, multi-vendor emoji
pml-fieldlosses bench --quick             # a few minutes
pml-fieldlosses bench --label-noise 0.2   # 20 % of the training labels corrupted
pml-fieldlosses bench --data PATH         # your images, one folder per class
pml-fieldlosses select                    # choose each loss's margin on the validation classes
pml-fieldlosses claims                    # test the papers' claims (docs/claims.md)
pml-fieldlosses claims --quick            # the same in a few minutes (2 seeds: wide intervals)
"""

import argparse
import dataclasses
import os
import sys
import warnings
from pathlib import Path

from . import backbones, extras
from .errors import ADVICE, FileFault, UsageError, file_fault, float_range, int_range, writable_folder

# The largest values the options take: beyond them a run exhausts the memory or runs for
# weeks without telling more. An image takes 3 * S * S bytes in memory (0.8 MB at 512 px).
MAX_SEEDS = 100
MAX_EPOCHS = 1000
MAX_EMBEDDING_SIZE = 4096
MAX_IMAGE_SIZE = 512
MAX_WORKERS = 256

# What each number option takes (by its argparse dest), checked right after parsing so that
# a bad value is a usage error (exit 2) like every other option's.
NUMBERS = {
    "seeds": int_range(1, MAX_SEEDS),
    "epochs": int_range(1, MAX_EPOCHS),
    "embedding_size": int_range(2, MAX_EMBEDDING_SIZE),
    "image_size": int_range(16, MAX_IMAGE_SIZE),
    "workers": int_range(1, MAX_WORKERS),
    "label_noise": float_range(0, 1, high_open=True),
}

# The fewest class folders the bench can split (protocol.make_split: half of them for
# training, two of those held out for validation, two left to train on; half for testing),
# and the fewest images a class needs to be kept (datasets.load_image_folder).
MIN_CLASSES = 8
MIN_IMAGES = 2
# the classes the losses are built with to check them before the data is loaded
STAND_IN_CLASSES = MIN_CLASSES


class Parser(argparse.ArgumentParser):
    """argparse with its errors in one line, like the command's own (--help shows the usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def bench_parser(subparsers):
    p = subparsers.add_parser(
        "bench",
        help="train and evaluate every loss on the same footing and write a report",
        description="Train every loss with the same trunk, embedder, sampler, optimiser and budget; "
        "select each run's epoch on validation classes carved from the training classes; test once "
        "on the held-out test classes; report MAP@R, P@1 and R-precision (mean and 95% CI over seeds).",
    )
    add_shared_options(p)
    p.add_argument("--seeds", metavar="N", help=f"seeds per loss, 1 to {MAX_SEEDS} (default 3; --quick: 2)")
    p.add_argument(
        "--label-noise",
        metavar="FRACTION",
        help="change exactly this fraction of the training labels, in [0, 1), to another class "
        "(validation and test labels stay clean)",
    )
    p.add_argument(
        "--quick", action="store_true", help="smaller budget: 2 seeds, at most 12 epochs, 1 augmented view"
    )
    p.set_defaults(check=check_bench, func=run_bench_command)
    return p


def select_parser(subparsers):
    p = subparsers.add_parser(
        "select",
        help="choose each loss's tuned hyperparameter on the validation classes",
        description="Train each candidate of every loss's tuned hyperparameter (its margin, radius or "
        "temperature: the published default, and the values with half and twice its margin) once with "
        "the benchmark's protocol and compare their best validation MAP@R; the test classes are never "
        "evaluated. Prints the table and the SELECTED dict of pml_fieldlosses/app/catalog.py.",
    )
    add_shared_options(p)
    p.set_defaults(check=check_select, func=run_select_command)
    return p


def claims_parser(subparsers):
    p = subparsers.add_parser(
        "claims",
        help="test the papers' claims with the bench's protocol and report a verdict for each",
        description="For each claim of the PFML, mean-field and DRML papers, train the runs of the "
        "experiment that tests it (the bench's runs; a run that several claims need is trained once), "
        "compare the arms by the paired difference over seeds with its 95% t-interval, and give a "
        "verdict: reproduced, not reproduced or inconclusive. See docs/claims.md.",
    )
    add_shared_options(p, losses=False, epochs_default="30; --quick: 8", out_default="claims_out")
    p.add_argument("--seeds", metavar="N", help=f"seeds per run, 1 to {MAX_SEEDS} (default 3; --quick: 2)")
    p.add_argument(
        "--claims",
        help="comma-separated claim ids (default: all): " + ",".join(claim.id for claim in _claims_table()),
    )
    p.add_argument(
        "--quick", action="store_true", help="smaller budget: 2 seeds, at most 8 epochs, 1 augmented view"
    )
    p.set_defaults(check=check_claims, func=run_claims_command)
    return p


def _claims_table():
    from .claims.table import CLAIMS

    return CLAIMS


def add_shared_options(p, losses=True, epochs_default="60; --quick: 12", out_default="bench_out"):
    from .catalog import LOSSES
    from .datasets import DATASETS

    if losses:
        p.add_argument(
            "--losses",
            help=f"comma-separated losses, each once (default: all available: {','.join(LOSSES)}); "
            "NAME[key=value,...] sets a loss's tuned hyperparameter or another keyword of its "
            "constructor, e.g. PFML[delta=0.3] or PFML[alpha=2,proxies_per_class=4]",
        )
    p.add_argument(
        "--epochs",
        metavar="N",
        help=f"maximum epochs per run, 1 to {MAX_EPOCHS}, with early stopping (default {epochs_default})",
    )
    p.add_argument(
        "--embedding-size",
        metavar="D",
        help=f"embedding dimension, 2 to {MAX_EMBEDDING_SIZE} (default 128; DRML: divisible by 4)",
    )
    p.add_argument(
        "--backbone",
        choices=sorted(backbones.BACKBONES),
        help="efficientnet-lite0: frozen ImageNet trunk, cached features (default, fast on CPU); "
        "efficientnet-lite0-partial: its last layers trained on the cached output of the others (CPU); "
        "efficientnet-lite0-finetune: all of it trained (GPU); convnet: small convnet from scratch",
    )
    p.add_argument(
        "--image-size",
        metavar="S",
        help=f"image side in pixels, 16 to {MAX_IMAGE_SIZE} (default 64; the images are held in memory, "
        "3*S*S bytes each)",
    )
    p.add_argument(
        "--data",
        help=f"a built-in data set ({', '.join(DATASETS)}; default emoji) or a folder with one sub-folder "
        f"per class (at least {MIN_CLASSES} with {MIN_IMAGES} images or more)",
    )
    p.add_argument(
        "--device",
        help="torch device for training, available on this machine, e.g. cpu, cuda or cuda:1 (default cpu)",
    )
    p.add_argument(
        "--workers",
        metavar="N",
        help=f"runs trained side by side, each single-threaded, 1 to {MAX_WORKERS} "
        "(default: one per CPU core; 1 on a GPU)",
    )
    p.add_argument(
        "--ray-address",
        help="spread the runs over a Ray cluster: 'auto' (the cluster this node belongs to), HOST:PORT, "
        "ray://HOST:PORT, or 'local' (a new Ray instance on this machine); one GPU per run with --device "
        "cuda (needs the cluster extra; see docs/cluster.md)",
    )
    p.add_argument(
        "--out", help=f"output folder, created if needed (default ./{out_default}); reruns resume there"
    )
    p.add_argument(
        "--cache",
        help="cache folder for data and features (default: $PML_FIELDLOSSES_CACHE or the user cache)",
    )


# --- the checks, right after parsing: nothing is loaded, trained or written before they pass ---


def check_bench(args, selection=False):
    """The BenchConfig of bench's (or select's) options, every option checked."""
    parse_numbers(args)
    if args.losses is not None:
        from .catalog import get_entry

        for name in split_losses(args.losses):
            usage("--losses", get_entry, name)
    config = usage(None, config_from_args, args)
    check_losses(config, "--losses" if args.losses is not None else "--embedding-size")
    if selection:
        from .bench.selection import selectable_entries

        usage("--losses", selectable_entries, config.losses)
    check_runtime(config)
    results = Path(config.out) / config.folder_name(selection=selection)
    check_folders(config, [results])
    return config


def check_select(args):
    return check_bench(args, selection=True)


def check_claims(args):
    """(the claims' BenchConfig, the claim ids or None for all) of claims' options, every option checked."""
    from .claims.run import check_epochs, claims_config, level_configs, report_folder
    from .claims.table import get_claims

    parse_numbers(args)
    ids = None
    if args.claims is not None:
        ids = [i.strip() for i in args.claims.split(",") if i.strip()]
        if not ids:
            raise UsageError(
                f"argument --claims: {args.claims!r} names no claim; leave it out for all claims"
            )
    claims = usage("--claims", get_claims, ids)
    config = usage(None, claims_config, quick=args.quick, **given_settings(args, exclude=("losses",)))
    usage(None, check_epochs, config, claims)
    levels = level_configs(config, claims).values()
    for level in levels:
        check_losses(level, "--embedding-size")
    check_runtime(config)
    results = [report_folder(config, claims)] + [Path(c.out) / c.folder_name() for c in levels]
    check_folders(config, results)
    return config, ids


def parse_numbers(args):
    """The number options of ``args`` (strings as parsed) as numbers, each in its range (NUMBERS)."""
    for dest, parse in NUMBERS.items():
        text = getattr(args, dest, None)
        if isinstance(text, str):
            try:
                setattr(args, dest, parse(text))
            except argparse.ArgumentTypeError as e:
                raise UsageError(f"argument --{dest.replace('_', '-')}: {e}") from None


def usage(option, call, *args, **kwargs):
    """``call(*args, **kwargs)``, its ValueError a usage error of ``option`` (None: the
    message names the option itself)."""
    try:
        return call(*args, **kwargs)
    except ValueError as e:
        raise UsageError(f"argument {option}: {e}" if option else str(e)) from e


def split_losses(text):
    """The names of --losses: commas outside brackets separate them, so that
    PFML[alpha=2,proxies_per_class=4] is one name; empty names are skipped."""
    names, name, depth = [], "", 0
    for char in text:
        if char == "," and depth == 0:
            names.append(name)
            name = ""
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            break
        name += char
    if depth:
        raise UsageError(
            f"argument --losses: unbalanced brackets in {text!r}: write NAME[key=value,...], "
            "e.g. PFML[alpha=2,proxies_per_class=4]"
        )
    names = tuple(n.strip() for n in names + [name] if n.strip())
    if not names:
        raise UsageError(f"argument --losses: {text!r} names no loss; leave it out for all losses")
    return names


def check_losses(config, option):
    """Build every loss of ``config`` once, with stand-in classes, so that a value its
    constructor refuses (PFML[delta=-1], DRML with an embedding size not divisible by 4)
    is a usage error now. The global random state is left as it was, and warnings are left
    to the runs' own build of the losses (pipeline.check_config), which says them once."""
    import torch

    from .catalog import get_entry

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in config.losses:
            try:
                get_entry(name).build(STAND_IN_CLASSES, config.embedding_size)
            except (ValueError, TypeError) as e:
                raise UsageError(f"argument {option}: loss {name} cannot be built: {e}") from e


def check_runtime(config):
    """--data, --device and --ray-address: what this machine has."""
    check_data(config.data)
    check_device(config.device, config.ray_address)
    check_ray_address(config.ray_address)


def check_data(data):
    """--data: a built-in data set, or a folder with at least MIN_CLASSES class folders of
    at least MIN_IMAGES images each (the scan stops at MIN_CLASSES)."""
    from .datasets import DATASETS, IMAGE_EXTENSIONS

    if data in DATASETS:
        return
    accepted = f"a built-in data set ({', '.join(DATASETS)}) or a folder with one sub-folder per class"
    path = Path(data)
    if not data or not path.exists():
        raise UsageError(f"argument --data: {data!r} is not {accepted} (no such folder)")
    if not path.is_dir():
        raise UsageError(f"argument --data: {data} is a file; expected {accepted}")
    classes = 0
    try:
        for folder in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
            images = [f for f in folder.iterdir() if f.suffix.lower() in IMAGE_EXTENSIONS and f.is_file()]
            if len(images) >= MIN_IMAGES:
                classes += 1
            if classes == MIN_CLASSES:
                return
    except OSError as e:
        raise file_fault(e, e.filename or path, "--data: cannot read") from e
    raise UsageError(
        f"argument --data: {data} has {classes} sub-folders with {MIN_IMAGES} images or more "
        f"({', '.join(IMAGE_EXTENSIONS)}); the bench needs {MIN_CLASSES} classes or more "
        "(one sub-folder each: half of them for training and validation, half for testing)"
    )


def check_device(text, ray_address):
    """--device: a torch device available on this machine (it computes the frozen features
    even when the runs go to Ray); with Ray, cpu or cuda without an index (Ray gives each
    run its GPU)."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(
            f"argument --device: {text!r} is not a torch device; available here: {available_devices()}"
        ) from None
    if not device_available(device):
        raise UsageError(
            f"argument --device: {text} is not available on this machine; available here: {available_devices()}"
        )
    if ray_address is not None and (device.type not in ("cpu", "cuda") or device.index is not None):
        raise UsageError(
            f"argument --device: with --ray-address give cpu or cuda (Ray gives each run its GPU), got {text!r}"
        )


def device_available(device):
    import torch

    if device.type == "cpu":
        return True
    if device.type == "mps":
        return torch.backends.mps.is_available() and not device.index
    backend = getattr(torch, device.type, None) if device.type in ("cuda", "xpu") else None
    if backend is None or not backend.is_available():
        return False
    return device.index is None or device.index < backend.device_count()


def available_devices():
    """The devices this machine can train on, in words, e.g. "cpu, cuda (cuda:0 to cuda:3)"."""
    import torch

    found = ["cpu"]
    for kind in ("cuda", "xpu"):
        backend = getattr(torch, kind, None)
        if backend is not None and backend.is_available():
            count = backend.device_count()
            found.append(kind if count == 1 else f"{kind} ({kind}:0 to {kind}:{count - 1})")
    if torch.backends.mps.is_available():
        found.append("mps")
    return ", ".join(found)


def check_ray_address(address):
    """--ray-address: an address Ray takes (cluster.check_address), and the cluster extra installed."""
    if address is None:
        return
    from .cluster import check_address

    check_address(address, "--ray-address")
    missing = extras.missing_modules("cluster")
    if missing:
        raise UsageError(
            f"argument --ray-address: running on Ray needs {', '.join(missing)}, not installed here: "
            f"{extras.install_hint(['cluster'])}"
        )


def check_folders(config, results):
    """The results folders (under --out) are not files, and files can be written in the cache
    folder and in --out (created if needed, the cache first: --out stays as it was when the
    cache fails)."""
    from .datasets import CACHE_ENV_VAR

    for option, text in (("--out", config.out), ("--cache", config.cache)):
        if text == "":
            raise UsageError(f"argument {option}: expected a folder, got ''")
    for folder in results:
        if folder.exists() and not folder.is_dir():
            raise FileFault(f"--out: {folder} is a file, not a folder: move it away or choose another --out")
    if config.cache is not None:
        writable_folder(Path(config.cache).expanduser(), "--cache")
    elif os.environ.get(CACHE_ENV_VAR):
        writable_folder(Path(os.environ[CACHE_ENV_VAR]).expanduser(), f"${CACHE_ENV_VAR}")
    writable_folder(config.out, "--out")


# --- the commands ------------------------------------------------------------------------------


def given_settings(args, exclude=()):
    """{BenchConfig field: value} of the options given (the others default to None)."""
    from .bench.protocol import BenchConfig

    fields = {f.name for f in dataclasses.fields(BenchConfig)} - {"quick", *exclude}
    return {k: v for k, v in vars(args).items() if k in fields and v is not None}


def config_from_args(args):
    """The BenchConfig of the options given; the others keep BenchConfig's defaults
    (the options default to None)."""
    from .bench.protocol import BenchConfig, quick_config

    settings = given_settings(args)
    if getattr(args, "losses", None) is not None:
        settings["losses"] = split_losses(args.losses)
    return quick_config(**settings) if getattr(args, "quick", False) else BenchConfig(**settings)


def run_bench_command(config):
    from .bench.benchmark import run_bench

    run_bench(config)


def run_select_command(config):
    from .bench import selection

    selection.run_selection(config)


def run_claims_command(plan):
    from .claims.run import run_claims

    config, ids = plan
    run_claims(config, ids)


def advice(error):
    """What to do about ``error`` (an OSError), by its errno (errors.ADVICE), else its words."""
    return ADVICE.get(error.errno) or error.strerror or str(error)


def one_line(error):
    """The line that reports ``error``: a usage error or file fault as it is, an OSError with
    its path, any other error with the hint to see its traceback."""
    if isinstance(error, (UsageError, FileFault)):
        text = str(error)
    elif isinstance(error, OSError):
        path = error.filename if error.filename2 is None else f"{error.filename} -> {error.filename2}"
        text = f"{path}: {advice(error)}" if path is not None else advice(error)
    else:
        text = f"{error} (--traceback shows where)"
    return " ".join(text.split("\n"))


def exit_code(error):
    """2 for a usage error (nothing ran), 1 for a failure of the run or of the file system."""
    return 2 if isinstance(error, UsageError) else 1


def main(argv=None):
    parser = Parser(prog="pml-fieldlosses", description=__doc__.split("\n")[0])
    parser.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    subparsers = parser.add_subparsers(dest="command", required=True)
    bench_parser(subparsers)
    select_parser(subparsers)
    claims_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        args.func(args.check(args))
    except (OSError, ValueError, RuntimeError) as e:  # UsageError, FileFault among them
        if args.traceback:
            raise
        print(f"pml-fieldlosses {args.command}: error: {one_line(e)}", file=sys.stderr)
        return exit_code(e)
    except KeyboardInterrupt:
        print("\ninterrupted: finished runs are kept; run the same command again to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
