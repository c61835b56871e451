"""Two costs of torch's elementwise operations that decide how this package writes its losses'
sums, each printed as a ratio to the plain operation, timed in one process.

    python benchmarks/bench_slow_paths.py                     # (180, 500), float32 and float64, CPU
    python benchmarks/bench_slow_paths.py --shape 360 100 --dtypes float32
    python benchmarks/bench_slow_paths.py --device cuda

* exp of inputs whose result is not a normal number: -inf (what a masked logsumexp such as
  PML's sets the left-out entries to before the exponential) and values far below 0, next to
  exp of ordinary values (standard normal). On a CPU torch takes a slow path for them.
* a bool mask: masked_fill and torch.where by a random mask and by a structured one (the
  layout of a loss call's rows: a block of columns per row, one entry left out), next to a
  multiplication by the same mask as floats; and the making of the structured mask.

Times are medians of --reps interleaved rounds; every clock read waits for the device.
"""

import argparse
import math
import statistics

import device as bench_device  # this folder's device options (on sys.path as a script)
import torch


def cases(rows, columns, dtype, device, generator):
    """The timed operations by name, each a function of no arguments."""
    values = torch.randn(rows, columns, generator=generator, dtype=dtype).to(device)
    minus_inf = torch.full((rows, columns), -math.inf, dtype=dtype, device=device)
    far_below = torch.full((rows, columns), 2 * math.log(torch.finfo(dtype).tiny), dtype=dtype, device=device)
    random_mask = (torch.rand(rows, columns, generator=generator) < 0.5).to(device)
    # a structured mask: each row keeps one block of columns (its group's) but one entry (its label)
    blocks = 5
    width = max(1, columns // blocks)
    block_of_column = torch.arange(columns, device=device) // width
    block_of_row = torch.randint(0, blocks, (rows,), generator=generator).to(device)
    label = torch.randint(0, width, (rows,), generator=generator).to(device)
    column_in_block = torch.arange(columns, device=device) % width

    def structured():
        return (block_of_column == block_of_row.unsqueeze(1)) & (column_in_block != label.unsqueeze(1))

    structured_mask = structured()
    float_mask = structured_mask.to(dtype)
    return {
        "exp, ordinary values": lambda: torch.exp(values),
        "exp, -inf": lambda: torch.exp(minus_inf),
        "exp, far below 0 (result 0)": lambda: torch.exp(far_below),
        "multiply by a float mask": lambda: values * float_mask,
        "masked_fill, random bool mask": lambda: values.masked_fill(random_mask, 0),
        "where, random bool mask": lambda: torch.where(random_mask, values, 0.0),
        "masked_fill, structured bool mask": lambda: values.masked_fill(structured_mask, 0),
        "make the structured bool mask": structured,
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", type=int, nargs=2, default=[180, 500], metavar=("ROWS", "COLUMNS"))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"], choices=["float32", "float64"])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    bench_device.add_device_options(parser)
    args = parser.parse_args()
    device = bench_device.check_device(parser, args)
    if min(args.shape) < 1 or args.reps < 1:
        parser.error("--shape and --reps must be positive")
    if args.autocast != "none":
        parser.error("argument --autocast: the operations here run in the dtypes of --dtypes")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"{bench_device.describe(args)} shape={tuple(args.shape)}, median of {args.reps} interleaved rounds"
    )
    for name in args.dtypes:
        timed = cases(*args.shape, getattr(torch, name), device, torch.Generator().manual_seed(0))
        seconds = {case: [] for case in timed}
        for _ in range(args.reps):
            for case, run in timed.items():
                start = bench_device.clock(device)
                run()
                seconds[case].append(bench_device.clock(device) - start)
        medians = {case: statistics.median(values) for case, values in seconds.items()}
        print(f"{name:<36}{'us':>9}  x baseline")
        for case, median in medians.items():
            baseline = "exp, ordinary values" if case.startswith("exp") else "multiply by a float mask"
            print(f"{case:<36}{1e6 * median:9.1f}  {median / medians[baseline]:9.2f}")


if __name__ == "__main__":
    main()
