"""Choose where to cut EfficientNet-Lite0 and how fast its trained part learns: the table
behind ``efficientnet-lite0-partial`` (docs/bench.md, "The trained trunk").

Each (cut, trunk lr multiplier, warm-up epochs) is the bench's run of each loss with seed 0 at the claims'
``--quick`` budget (8 epochs, 1 augmented view); cut 18 is the frozen trunk. Printed: the
best validation MAP@R (the only split a choice may look at), the training seconds per
epoch, and the wall seconds of each setting, its features included. A setting is
CUT:LR_MULTIPLIER, or CUT:LR_MULTIPLIER:WARMUP for a trunk frozen during its first WARMUP
epochs.

    python scripts/choose_trunk_cut.py --settings 18:0,16:0.1,16:0.03,16:0.01,17:0.1,17:0.03:1
"""

import argparse
import sys
import time

from pml_fieldlosses.app import backbones
from pml_fieldlosses.app.bench.pipeline import Part, run_plan
from pml_fieldlosses.app.bench.protocol import BenchConfig


def settings(text):
    """``CUT:MULTIPLIER[:WARMUP],...`` -> [(cut, multiplier, warmup), ...]."""
    try:
        parts = [item.split(":") for item in text.split(",")]
        if any(len(p) not in (2, 3) for p in parts):
            raise ValueError
        return [(int(p[0]), float(p[1]), int(p[2]) if len(p) == 3 else 0) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected CUT:LR_MULTIPLIER[:WARMUP],... (e.g. 16:0.01 or 17:0.03:1), got {text!r}"
        ) from None


def backbone_name(cut, multiplier, warmup):
    """The bench's backbone for the setting (registered for this process and its workers)."""
    if cut == backbones.LITE0_LAYERS:
        return "efficientnet-lite0"
    name = f"efficientnet-lite0-cut{cut}-x{multiplier:g}" + (f"-warm{warmup}" if warmup else "")
    backbones.BACKBONES[name] = backbones.lite0(
        name, cut, f"layers {cut}-17 trained", multiplier, trunk_warmup_epochs=warmup
    )
    return name


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--settings", type=settings, default="18:0,16:0.01", help="comma-separated CUT:LR_MULTIPLIER"
    )
    parser.add_argument("--losses", default="ProxyAnchor,MFCont,PFML")
    parser.add_argument("--data", default="emoji")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--out", default="trunk_cut_out")
    parser.add_argument("--cache", default=None)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args(argv)
    losses = tuple(args.losses.split(","))
    print("cut  lr x   warm loss                 best val MAP@R  s/epoch")
    for cut, multiplier, warmup in args.settings:
        config = BenchConfig(
            losses=losses, seeds=1, epochs=args.epochs, patience=3, lr_decay_epochs=3, aug_views=1,
            quick=True, data=args.data, image_size=args.image_size, backbone=backbone_name(cut, multiplier, warmup),
            out=args.out, cache=args.cache, workers=args.workers,
        )  # fmt: skip
        start = time.perf_counter()
        ((_, _, results),) = run_plan([Part(config)], sys.stderr)
        for result in results:
            print(
                f"{cut:<4} {multiplier:<6g} {warmup:<4} {result.loss:<20} {result.best_val_map_at_r:14.3f}  "
                f"{result.seconds_per_epoch:7.2f}"
            )
        seconds = time.perf_counter() - start
        print(f"# cut {cut}, lr x {multiplier:g}, warm-up {warmup}: {seconds:.0f} s", flush=True)


if __name__ == "__main__":
    main()
