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
import sys

from . import backbones


def bench_parser(subparsers):
    p = subparsers.add_parser(
        "bench",
        help="train and evaluate every loss on the same footing and write a report",
        description="Train every loss with the same trunk, embedder, sampler, optimiser and budget; "
        "select each run's epoch on validation classes carved from the training classes; test once "
        "on the held-out test classes; report MAP@R, P@1 and R-precision (mean and 95% CI over seeds).",
    )
    add_shared_options(p)
    p.add_argument("--seeds", type=int, help="number of seeds per loss (default 3; --quick: 2)")
    p.add_argument(
        "--label-noise",
        type=float,
        metavar="FRACTION",
        help="change exactly this fraction of the training labels to another class "
        "(validation and test labels stay clean)",
    )
    p.add_argument(
        "--quick", action="store_true", help="smaller budget: 2 seeds, at most 12 epochs, 1 augmented view"
    )
    p.set_defaults(func=run_bench_command)
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
    p.set_defaults(func=run_select_command)
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
    p.add_argument("--seeds", type=int, help="number of seeds per run (default 3; --quick: 2)")
    p.add_argument(
        "--claims",
        help="comma-separated claim ids (default: all): " + ",".join(claim.id for claim in _claims_table()),
    )
    p.add_argument(
        "--quick", action="store_true", help="smaller budget: 2 seeds, at most 8 epochs, 1 augmented view"
    )
    p.set_defaults(func=run_claims_command)
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
            help=f"comma-separated losses (default: all available: {','.join(LOSSES)}); "
            "NAME[key=value,...] sets a loss's tuned hyperparameter or another keyword of its "
            "constructor, e.g. PFML[delta=0.3] or PFML[alpha=2,proxies_per_class=4]",
        )
    p.add_argument(
        "--epochs",
        type=int,
        help=f"maximum epochs per run, with early stopping (default {epochs_default})",
    )
    p.add_argument("--embedding-size", type=int, help="embedding dimension (default 128)")
    p.add_argument(
        "--backbone",
        choices=sorted(backbones.BACKBONES),
        help="efficientnet-lite0: frozen ImageNet trunk, cached features (default, fast on CPU); "
        "efficientnet-lite0-finetune: fine-tune it (GPU); convnet: small convnet from scratch",
    )
    p.add_argument("--image-size", type=int, help="image side in pixels (default 64)")
    p.add_argument(
        "--data",
        help=f"a built-in data set ({', '.join(DATASETS)}; default emoji) or a folder with one sub-folder per class",
    )
    p.add_argument("--device", help="torch device for training, e.g. cpu or cuda (default cpu)")
    p.add_argument(
        "--workers",
        type=int,
        help="runs trained side by side, each single-threaded (default: one per CPU core; 1 on a GPU)",
    )
    p.add_argument(
        "--ray-address",
        help="spread the runs over a Ray cluster: 'auto' (the cluster this node belongs to), HOST:PORT, or "
        "'local' (a new Ray instance on this machine); one GPU per run with --device cuda "
        "(needs the cluster extra; see docs/cluster.md)",
    )
    p.add_argument("--out", help=f"output folder (default ./{out_default}); reruns resume there")
    p.add_argument(
        "--cache",
        help="cache folder for data and features (default: $PML_FIELDLOSSES_CACHE or the user cache)",
    )


def config_from_args(args):
    """The BenchConfig of the options given; the others keep BenchConfig's defaults
    (the options default to None)."""
    from .bench.protocol import BenchConfig, quick_config

    fields = {f.name for f in dataclasses.fields(BenchConfig)} - {"quick"}
    settings = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    if getattr(args, "losses", None) is not None:
        settings["losses"] = tuple(name.strip() for name in args.losses.split(",") if name.strip())
    return quick_config(**settings) if getattr(args, "quick", False) else BenchConfig(**settings)


def run_bench_command(args):
    from .bench.benchmark import run_bench

    run_bench(config_from_args(args))


def run_select_command(args):
    from .bench import selection

    selection.run_selection(config_from_args(args))


def run_claims_command(args):
    from .bench.protocol import BenchConfig
    from .claims.run import claims_config, run_claims

    fields = {f.name for f in dataclasses.fields(BenchConfig)} - {"quick", "losses"}
    settings = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    ids = None
    if args.claims is not None:
        ids = [i.strip() for i in args.claims.split(",") if i.strip()]
        if not ids:
            raise ValueError(f"--claims {args.claims!r} names no claim; leave it out for all claims")
    run_claims(claims_config(quick=args.quick, **settings), ids)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="pml-fieldlosses", description=__doc__.split("\n")[0])
    parser.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    subparsers = parser.add_subparsers(dest="command", required=True)
    bench_parser(subparsers)
    select_parser(subparsers)
    claims_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        if args.traceback:
            raise
        print(f"pml-fieldlosses: error: {e} (--traceback shows where)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: finished runs are kept; run the same command again to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
