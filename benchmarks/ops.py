"""Counting what a step asks of a GPU, on any device: the operations it dispatches and those
after which the host waits for the device.

On a GPU a step of these losses at ordinary shapes is bound by its host, not by its
arithmetic: each aten operation is a kernel launch of a few microseconds, and each operation
whose output's size depends on the data (``nonzero``, a boolean mask's index) or that reads a
value on the host (``item``, ``tolist``, ``bool``) makes the host wait until the GPU has
finished everything queued before it. The counts are those of the device the step runs on:
the potential losses take larger blocks on a GPU than on a CPU (``gather_block_entries``)
and, on CPUs where they pay, bfloat16 searches: a CPU can count more than a GPU runs. On a
CPU a read of a CPU tensor's values with ``tolist()`` dispatches no operation and is not
counted.
"""

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pml_fieldlosses.losses import BaseMeanFieldLoss, BasePotentialLoss
from pml_fieldlosses.losses.potential import distances

# operations whose output's size depends on the data, or that read a value on the host
WAITING_OPS = {
    "nonzero",
    "_local_scalar_dense",  # item(), int(), float(), bool()
    "masked_select",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "repeat_interleave",
}
# indexing with a boolean mask runs nonzero inside
MASK_INDEXING_OPS = {"index", "index_put", "index_put_", "_index_put_impl_"}


def waits(name, args, kwargs):
    """Whether the host waits for the device after the operation ``name`` on these arguments."""
    if name in WAITING_OPS:
        return True
    if name in MASK_INDEXING_OPS:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
    if name in ("_to_copy", "copy_"):  # a copy from another device to the CPU
        source = args[1] if name == "copy_" else args[0]
        target = args[0].device if name == "copy_" else kwargs.get("device")
        return target is not None and torch.device(target).type == "cpu" and source.device.type != "cpu"
    return False


class OpCounter(TorchDispatchMode):
    """Within ``with OpCounter() as counter:``, ``counter.ops`` counts the aten operations
    dispatched (forward and backward) and ``counter.waits`` those after which the host waits
    for the device."""

    def __init__(self):
        super().__init__()
        self.ops = self.waits = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        self.waits += waits(func.overloadpacket.__name__, args, kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def as_on_gpu(loss_fn):
    """Within it, a loss on any device takes the settings it takes on a GPU, so that a CPU
    counts a GPU's operations: autograd's normalisation rather than the fused one the losses
    take on a CPU (NormalizedRows), and for the potential losses float32 searches, blocks of
    gathered coordinates of a GPU's size (``gather_block_entries``) and entries_below without
    its tile screening (``screens_tiles``). PML's losses are left as they are."""
    gpu = torch.device("cuda")
    patched = {}
    if isinstance(loss_fn, BaseMeanFieldLoss):
        patched["normalized_mean_fields"] = lambda: loss_fn.distance.normalize(
            loss_fn.normalizable_mean_fields()
        )
    if isinstance(loss_fn, BasePotentialLoss):
        gpu_blocks = loss_fn.gather_block_entries(gpu)
        patched["normalized"] = loss_fn.distance.normalize
        patched["gather_block_entries"] = lambda device: gpu_blocks
        patched["bfloat16_search"] = False
    own = {name: vars(loss_fn)[name] for name in patched if name in vars(loss_fn)}
    saved_screens, gpu_screens = distances.screens_tiles, distances.screens_tiles(gpu)
    for name, value in patched.items():
        setattr(loss_fn, name, value)
    distances.screens_tiles = lambda device: gpu_screens
    try:
        yield
    finally:
        distances.screens_tiles = saved_screens
        for name in patched:  # the instance's own values, or none (the class's)
            if name in own:
                setattr(loss_fn, name, own[name])
            else:
                delattr(loss_fn, name)
