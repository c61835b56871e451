import copy
import math

import torch
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.reducers import MeanReducer, MultipleReducers
from pytorch_metric_learning.utils import common_functions as c_f

from ..models.relational_embedder import RelationalEmbedder, branch_outputs_of, known_finite
from ..utils import checks
from ..utils.loss_utils import index_counts, upcast_half
from .relational_proxy_anchor import batchable_proxy_anchor, proxy_anchor_terms


# "Deep Relational Metric Learning" (Zheng et al., ICCV 2021), the DRML objective;
# official code: zbr17/DRML (RelationEmbedder outputs + GeDML loss links)
class RelationalLoss(BaseMetricLossFunction):
    """The DRML objective around any PML loss, for the outputs of a RelationalEmbedder.

    loss = sum_k branch_losses[k](nodes of the samples assigned to branch k)
           + representation_weight * base_loss(embeddings)
           + reconstruction_weight * mean reconstruction error.

    A sample is assigned to the branch with the smallest reconstruction error
    (ties -> lowest branch index; not differentiated); an empty branch adds 0.
    The branch nodes and reconstruction errors travel with the embeddings: a
    training-mode forward of RelationalEmbedder attaches them to its output as
    ``embeddings.branch_outputs``, so the loss must receive that output tensor
    itself (any copy, cast or slice of it has none: a clear error).

    num_branches is the head's number of branches K; embedding_size its output
    size K * E (None: base_loss.embedding_size if it has one, else unchecked).
    base_loss sees the embeddings (size K * E), the branch losses the nodes
    (size E). branch_losses is None (base_loss is used for the branches too;
    only for a loss without parameters or buffers), one loss module (a
    template: each branch gets its own deep copy), a list of num_branches
    losses (the same module K times shares it), or a function with no
    arguments that returns a new loss (called once per branch), e.g.
    ``lambda: ProxyAnchorLoss(num_classes, embedding_size // num_branches)``.

    indices_tuple (from a miner on the embeddings) goes to base_loss unchanged.
    Branch k gets the tuples whose samples all lie in branch k, re-indexed
    into the branch, or, if branch_miner is given, branch_miner(branch nodes,
    branch labels).
    """

    def __init__(
        self,
        base_loss,
        branch_losses=None,
        num_branches=4,
        embedding_size=None,
        representation_weight=1.0,
        reconstruction_weight=1.0,
        branch_miner=None,
        **kwargs,
    ):
        if "distance" in kwargs:
            raise ValueError("RelationalLoss has no distance of its own: set the distance on base_loss")
        if "embedder" in kwargs or isinstance(base_loss, RelationalEmbedder):
            raise TypeError(
                "RelationalLoss takes no embedder (its first argument is base_loss): the RelationalEmbedder "
                "attaches its branch outputs to the embeddings it returns; pass num_branches and "
                "embedding_size instead, e.g. RelationalLoss(base_loss, branch_losses, "
                "num_branches=embedder.num_branches, embedding_size=embedder.embedding_size)"
            )
        super().__init__(**kwargs)
        if not isinstance(base_loss, torch.nn.Module):
            raise TypeError(f"base_loss must be a loss module, got {type(base_loss).__name__}")
        checks.check_positive_int("num_branches", num_branches)
        if embedding_size is None:
            embedding_size = declared_size(base_loss)
        if embedding_size is not None:
            checks.check_positive_int("embedding_size", embedding_size)
            if embedding_size % num_branches != 0:
                raise ValueError(
                    f"embedding_size={embedding_size} must be divisible by num_branches={num_branches}: "
                    "it is the head's output size, num_branches * branch_size"
                )
        checks.check_non_negative("representation_weight", representation_weight)
        checks.check_non_negative("reconstruction_weight", reconstruction_weight)
        self.num_branches = num_branches
        self.embedding_size = embedding_size
        self.branch_size = None if embedding_size is None else embedding_size // num_branches
        self.representation_weight = float(representation_weight)
        self.reconstruction_weight = float(reconstruction_weight)
        self.base_loss = base_loss
        check_size_attribute("base_loss", base_loss, self.embedding_size)
        # a ModuleDict keyed "branch_k": record-keeper names its tables after these keys, and
        # ModuleList's "0", "1", ... give table names that sqlite refuses
        self.branch_losses = torch.nn.ModuleDict(
            {f"branch_{k}": loss for k, loss in enumerate(self.build_branch_losses(base_loss, branch_losses))}
        )
        self.branch_miner = branch_miner
        base_parameters = {id(p) for p in base_loss.parameters()}
        for k in range(self.num_branches):
            check_size_attribute(f"branch_losses[{k}]", self.branch_loss_of(k), self.branch_size)
            if any(id(p) in base_parameters for p in self.branch_loss_of(k).parameters()):
                raise ValueError(
                    f"branch_losses[{k}] shares parameters with base_loss, but base_loss sees the embeddings "
                    "and the branch losses the branch nodes, of a different size"
                )
        self.add_to_recordable_attributes(
            list_of_names=["num_branches", "representation_weight", "reconstruction_weight"], is_stat=False
        )
        self.add_to_recordable_attributes(
            list_of_names=[f"num_samples_branch_{k}" for k in range(self.num_branches)], is_stat=True
        )

    def build_branch_losses(self, base_loss, branch_losses):
        K = self.num_branches
        if branch_losses is None:
            if has_state(base_loss):
                size = "embedding_size // num_branches" if self.branch_size is None else self.branch_size
                raise ValueError(
                    f"base_loss ({type(base_loss).__name__}) has parameters or buffers sized for the full "
                    "embedding; the branches need losses for the branch nodes: pass branch_losses, e.g. "
                    f"branch_losses={type(base_loss).__name__}(..., embedding_size={size}, ...)"
                )
            return [base_loss] * K
        if isinstance(branch_losses, torch.nn.Module):  # a template: one independent copy per branch
            return [copy.deepcopy(branch_losses) for _ in range(K)]
        if callable(branch_losses):
            losses = [branch_losses() for _ in range(K)]
        elif isinstance(branch_losses, (list, tuple)):
            if len(branch_losses) != K:
                raise ValueError(f"branch_losses has {len(branch_losses)} entries, expected num_branches={K}")
            losses = list(branch_losses)
        else:
            raise TypeError(
                "branch_losses must be None, a loss module, a list of num_branches loss modules or a "
                f"function returning a new loss module, got {type(branch_losses).__name__}"
            )
        for k, loss in enumerate(losses):
            if not isinstance(loss, torch.nn.Module):
                raise TypeError(f"branch_losses[{k}] must be a loss module, got {type(loss).__name__}")
        return losses

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        """PML's forward, except that the branch outputs are taken from ``embeddings``
        before half-precision inputs are upcast: the losses and the reduction run in at
        least float32 with autocast off."""
        # the head's fresh output is finite (it checks that itself): no second scan for NaN/inf
        checks.check_embeddings(embeddings, self.embedding_size, finite=not known_finite(embeddings))
        # the smallest num_classes of the base and branch losses (PML's proxy losses don't check
        # their labels, and a branch loss may have been built with fewer classes)
        num_classes, owner = self.smallest_num_classes()
        checks.check_labels(labels, embeddings, num_classes, owner=owner)
        if ref_emb is not None or ref_labels is not None:
            raise ValueError("RelationalLoss does not support ref_emb/ref_labels")
        nodes, errors = self.branch_outputs(embeddings)
        self.reset_stats()
        # any integer dtype as int64 on the embeddings' device: the base and branch losses may
        # index with them (PML's ProxyAnchorLoss one_hot needs int64)
        labels = checks.as_index_labels(labels, embeddings)
        with torch.autocast(embeddings.device.type, enabled=False):
            embeddings, nodes, errors = upcast_half(embeddings), upcast_half(nodes), upcast_half(errors)
            loss_dict = self.loss_terms(embeddings, nodes, errors, labels, indices_tuple)
            self.add_embedding_regularization_to_loss_dict(loss_dict, embeddings)
            loss = reduce_terms(self.reducer, loss_dict, embeddings, labels)
        if not torch.isfinite(loss.detach()):  # one device synchronisation
            self.explain_non_finite(loss_dict, loss)
        return loss

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        """PML's hook: the loss dict of the three weighted terms for ``embeddings``,
        an output of the embedder's training-mode forward."""
        c_f.ref_not_supported(embeddings, labels, ref_emb, ref_labels)
        nodes, errors = self.branch_outputs(embeddings)
        return self.loss_terms(embeddings, nodes, errors, labels, indices_tuple)

    def branch_outputs(self, embeddings):
        """(nodes, errors) attached to ``embeddings`` by the head, checked against num_branches."""
        nodes, errors, _ = branch_outputs_of(embeddings)
        K, E = nodes.shape[1:]
        if K != self.num_branches or K * E != embeddings.shape[1]:
            raise ValueError(
                f"embeddings come from a RelationalEmbedder with {K} branches of size {E} (embedding size "
                f"{embeddings.shape[1]}), but the loss was built with num_branches={self.num_branches}"
            )
        if self.branch_size is None:  # sizes unknown at construction: check the branch losses now
            for k in range(K):
                check_size_attribute(f"branch_losses[{k}]", self.branch_loss_of(k), E)
        return nodes, errors

    def loss_terms(self, embeddings, nodes, errors, labels, indices_tuple):
        assignment, counts = self.assign(errors)
        # the ProxyAnchor terms in one pass where that is exact, the other terms call by call
        base_loss = (
            self.base_loss if indices_tuple is None and batchable_proxy_anchor([self.base_loss]) else None
        )
        branch_losses = self.batchable_branch_losses(counts, indices_tuple)
        representation_loss = branch_loss = None
        if base_loss is not None or branch_losses:
            representation_loss, branch_loss = proxy_anchor_terms(
                base_loss, embeddings, branch_losses, nodes, assignment, counts, labels
            )
        if branch_loss is None:
            branch_loss = self.branch_loss_by_calls(nodes, assignment, counts, labels, indices_tuple)
        if representation_loss is None:
            representation_loss = self.base_loss(embeddings, labels, indices_tuple)
        # the mean, divided before the sum: errors near the dtype's largest value have a finite mean
        reconstruction_loss = errors.div(errors.numel()).sum()
        return {
            "branch_loss": already_reduced(branch_loss),
            "representation_loss": already_reduced(weighted(self.representation_weight, representation_loss)),
            "reconstruction_loss": already_reduced(weighted(self.reconstruction_weight, reconstruction_loss)),
        }

    def explain_non_finite(self, loss_dict, loss):
        """A clear error instead of returning a NaN/inf loss: which term, and why."""
        causes = {
            "branch_loss": "one of the branch losses returned it",
            "representation_loss": f"representation_weight={self.representation_weight:g} times "
            f"base_loss ({type(self.base_loss).__name__})",
            "reconstruction_loss": f"reconstruction_weight={self.reconstruction_weight:g} times the mean "
            "reconstruction error",
        }
        values = {name: scalar(term["losses"]) for name, term in loss_dict.items()}
        for name, value in values.items():
            if not math.isfinite(value):
                cause = causes.get(name, "the embedding regularizer returned it")
                raise ValueError(f"RelationalLoss's {name} is {value}: {cause}")
        raise ValueError(
            f"RelationalLoss is {scalar(loss)}: the sum of its finite terms overflows "
            f"{loss.dtype} ({', '.join(f'{n}={v:g}' for n, v in values.items())})"
        )

    def assign(self, errors):
        """Each sample's branch, that of its smallest reconstruction error (ties -> lowest
        index), and the number of samples of each branch (recorded as statistics)."""
        assignment = errors.detach().argmin(dim=1)  # first minimum: ties -> lowest index
        counts = index_counts(assignment, self.num_branches).tolist()
        if self.collect_stats:
            for k in range(self.num_branches):
                setattr(self, f"num_samples_branch_{k}", counts[k])
        return assignment, counts

    def branch_loss(self, nodes, errors, labels, indices_tuple):
        """Sum over branches of the branch loss on the samples assigned to the branch."""
        assignment, counts = self.assign(errors)
        branch_losses = self.batchable_branch_losses(counts, indices_tuple)
        if branch_losses:
            return proxy_anchor_terms(None, None, branch_losses, nodes, assignment, counts, labels)[1]
        return self.branch_loss_by_calls(nodes, assignment, counts, labels, indices_tuple)

    def batchable_branch_losses(self, counts, indices_tuple):
        """{k: branch loss k} of the branches with samples (an empty branch adds 0) if
        proxy_anchor_terms computes them exactly, else {}."""
        if indices_tuple is not None or self.branch_miner is not None:
            return {}
        losses = {k: self.branch_loss_of(k) for k in range(self.num_branches) if counts[k] > 0}
        return losses if batchable_proxy_anchor(list(losses.values())) else {}

    def branch_loss_by_calls(self, nodes, assignment, counts, labels, indices_tuple):
        """The branch term with each branch loss called on its own samples."""
        order = torch.argsort(assignment, stable=True)  # the samples grouped by branch, in batch order
        # each sample's own node, gathered at once: one indexing op (and one scatter in the
        # backward) instead of one per branch
        grouped_nodes, grouped_labels = nodes[order, assignment[order]], labels[order]
        grouped_nodes, grouped_labels = grouped_nodes.split(counts), grouped_labels.split(counts)
        total = 0
        for k, members in enumerate(order.split(counts)):
            if counts[k] == 0:  # an empty branch adds 0
                continue
            branch_nodes, branch_labels = grouped_nodes[k], grouped_labels[k]
            if self.branch_miner is not None:
                branch_tuple = self.branch_miner(branch_nodes, branch_labels)
            else:
                branch_tuple = restrict_indices_tuple(indices_tuple, members, len(labels))
            total = total + self.branch_loss_of(k)(branch_nodes, branch_labels, branch_tuple)
        return total

    def branch_loss_of(self, k):
        return self.branch_losses[f"branch_{k}"]

    def smallest_num_classes(self):
        """The smallest num_classes among base_loss and the branch losses and the name of the
        first loss that has it, e.g. (3, "branch_losses[0] (ProxyAnchorLoss)"); (None, None) if
        none declares one."""
        named = [("base_loss", self.base_loss)]
        named += [(f"branch_losses[{k}]", self.branch_loss_of(k)) for k in range(self.num_branches)]
        found = [(declared_classes(loss), name, loss) for name, loss in named if declared_classes(loss)]
        if not found:
            return None, None
        num_classes, name, loss = min(found, key=lambda entry: entry[0])
        return num_classes, f"{name} ({type(loss).__name__})"

    def _sub_loss_names(self):
        return ["branch_loss", "representation_loss", "reconstruction_loss"]


def restrict_indices_tuple(indices_tuple, members, batch_size):
    """The tuples of indices_tuple (triplets (a, p, n) or pairs (a1, p, a2, n))
    whose samples are all in ``members``, re-indexed into ``members``."""
    if indices_tuple is None:
        return None
    if len(indices_tuple) == 3:
        groups = [(0, 1, 2)]
    elif len(indices_tuple) == 4:
        groups = [(0, 1), (2, 3)]
    else:
        raise ValueError(
            "indices_tuple must be triplets (anchors, positives, negatives) or pairs "
            f"(anchors1, positives, anchors2, negatives), got a tuple of length {len(indices_tuple)}"
        )
    local = torch.full((batch_size,), -1, dtype=torch.long, device=members.device)
    local[members] = torch.arange(len(members), device=members.device)
    restricted = []
    for group in groups:
        mapped = [local[indices_tuple[i].to(members.device)] for i in group]
        keep = torch.stack(mapped).ge(0).all(dim=0)
        restricted.extend(m[keep] for m in mapped)
    return tuple(restricted)


def has_state(module):
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def declared_size(loss):
    """The loss's ``embedding_size`` attribute if it is a positive int (our losses have
    one; PML's store none, or 0), else None."""
    size = getattr(loss, "embedding_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def declared_classes(loss):
    """The loss's ``num_classes`` attribute if it is a positive int, else None (PML records 0
    for losses that do not store it, e.g. ProxyNCALoss and NormalizedSoftmaxLoss)."""
    num_classes = getattr(loss, "num_classes", None)
    if isinstance(num_classes, int) and not isinstance(num_classes, bool) and num_classes > 0:
        return num_classes
    return None


def check_size_attribute(name, loss, expected):
    size = declared_size(loss)
    if expected is not None and size is not None and size != expected:
        raise ValueError(
            f"{name} was built with embedding_size={size}, but it receives embeddings of size {expected}"
        )


def scalar(value):
    return float(torch.as_tensor(value).detach())


def weighted(weight, loss):
    """weight * loss; the loss itself for the default weight 1 (the same value and gradient,
    bit for bit, without a multiplication and its backward)."""
    return loss if weight == 1.0 else weight * loss


def already_reduced(loss):
    return {"losses": loss, "indices": None, "reduction_type": "already_reduced"}


def reduce_terms(reducer, loss_dict, embeddings, labels):
    """reducer(loss_dict, embeddings, labels). With PML's default reducer for the terms
    (MultipleReducers of MeanReducers, no statistics, no hooks) and every term a scalar of the
    embeddings' dtype already reduced, that is the sum of the terms, written into a zero tensor
    term by term and summed; here stacked and summed: the same value and gradients, bit for bit,
    without the dozen autograd steps of the copies into the zeros."""
    if type(reducer) is not MultipleReducers:
        return reducer(loss_dict, embeddings, labels)
    term_reducers = [
        reducer.reducers[name] if name in reducer.reducers else reducer.default_reducer for name in loss_dict
    ]
    plain_sum = (
        all(type(module) is MeanReducer for module in term_reducers)
        and not any(
            m.collect_stats or m._forward_hooks or m._forward_pre_hooks for m in [reducer, *term_reducers]
        )
        and all(
            term["reduction_type"] == "already_reduced"
            and torch.is_tensor(term["losses"])
            and term["losses"].ndim == 0
            and term["losses"].dtype == embeddings.dtype
            and term["losses"].device == embeddings.device
            for term in loss_dict.values()
        )
    )
    if not plain_sum:
        return reducer(loss_dict, embeddings, labels)
    return torch.sum(torch.stack([term["losses"] for term in loss_dict.values()]))
