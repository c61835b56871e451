"""Device, autocast and timing options shared by the scripts in this folder.

Every benchmark takes ``--device`` (``cpu``, ``cuda``, ``cuda:1``, ...) and
``--autocast`` (``none``, ``float16``, ``bfloat16``). Under autocast the step
being timed (trunk, head and loss forward) runs in ``torch.autocast`` of that
dtype, and the backward pass outside it, as a mixed-precision training step
does; the parameters stay in float32. On CUDA every timer waits for the GPU
(``torch.cuda.synchronize``) before it reads the clock.
"""

import contextlib
import time

import torch

AUTOCAST_DTYPES = {"none": None, "float16": torch.float16, "bfloat16": torch.bfloat16}


def add_device_options(parser, default_device="cpu"):
    parser.add_argument("--device", default=default_device, help="cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument(
        "--autocast",
        default="none",
        choices=list(AUTOCAST_DTYPES),
        help="run the timed forward passes under torch.autocast of this dtype (default: none)",
    )


def check_device(parser, args):
    """Stops with a parser error when --device names no usable device (before any work)."""
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        parser.error(f"argument --device: {error}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"argument --device: {args.device} asked for, but torch sees no CUDA device")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"argument --device: expected cpu, cuda or cuda:N, got {args.device!r}")
    if args.autocast == "float16" and device.type == "cpu" and not _cpu_float16_autocast():
        parser.error("argument --autocast: float16 autocast needs a CUDA device with this torch")
    return device


def _cpu_float16_autocast():
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            torch.ones(2, 2) @ torch.ones(2, 2)
        return True
    except RuntimeError:
        return False


def autocast(args):
    """The context the timed forward passes run in: torch.autocast, or nothing with --autocast none."""
    dtype = AUTOCAST_DTYPES[args.autocast]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(args.device).type, dtype=dtype)


def synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def clock(device):
    """Wall-clock seconds after the device has finished its queued work."""
    synchronize(device)
    return time.perf_counter()


def describe(args):
    """One line naming the device, the autocast dtype, torch and the threads, for a benchmark's header."""
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return (
        f"device={args.device} ({name}) autocast={args.autocast} torch={torch.__version__} "
        f"threads={torch.get_num_threads()}"
    )
