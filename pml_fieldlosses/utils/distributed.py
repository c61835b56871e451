import torch
from pytorch_metric_learning.utils import distributed as pml_dist


class DistributedLossWrapper(pml_dist.DistributedLossWrapper):
    """PML's DistributedLossWrapper, with exact gradients for the loss's own parameters.

    PML's wrapper gathers the embeddings of all ranks, computes the loss on the
    whole batch on every rank and multiplies it by the world size, so that once
    DistributedDataParallel averages the model's gradients over the ranks, the
    model gets the gradient of one process on the concatenated batch. The loss's
    own parameters (mean fields, proxies) see the whole batch on every rank, so
    that factor stays in their gradient, also after DDP averages it. This
    wrapper divides their gradients by the world size during backward, so that
    with the recipe

        loss_func = DDP(DistributedLossWrapper(MeanFieldContrastiveLoss(...)))

    the model and the loss's parameters both get exactly the single-process
    gradients (DDP also broadcasts the parameters from rank 0 at construction
    and keeps them identical afterwards). Outside torch.distributed it is the
    plain loss.
    """

    def __init__(self, loss, efficient=False):
        super().__init__(loss, efficient=efficient)
        for parameter in loss.parameters():
            parameter.register_hook(divide_by_world_size)


def divide_by_world_size(grad):
    if pml_dist.is_distributed():
        return grad / torch.distributed.get_world_size()
    return grad
