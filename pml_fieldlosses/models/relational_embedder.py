import collections
import math
import weakref

import torch

from ..utils import checks

BranchOutputs = collections.namedtuple("BranchOutputs", ["nodes", "errors"])
BranchOutputs.__doc__ = """Side outputs of one training-mode forward of a RelationalEmbedder.

nodes: (batch_size, num_branches, branch_size), the unit-norm branch nodes n_k
(differentiable w.r.t. the trunk and the node layers).
errors: (batch_size, num_branches), the per-sample reconstruction errors e_k
(differentiable w.r.t. the decoders only)."""


class BranchLinear(torch.nn.Module):
    """K independent Linear layers applied to the K branches of the input at once.

    Input (batch_size, K, in_features) -> output (batch_size, K, out_features);
    branch k uses weight[k] (out_features, in_features) and bias[k]. Initialised
    like the official code: kaiming-normal with mode fan_out (std sqrt(2 / out_features))
    and bias 0.
    """

    def __init__(self, num_branches, in_features, out_features):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(num_branches, out_features, in_features))
        self.bias = torch.nn.Parameter(torch.zeros(num_branches, out_features))
        torch.nn.init.normal_(self.weight, std=math.sqrt(2 / out_features))

    def forward(self, x):
        out = torch.baddbmm(self.bias.unsqueeze(1), x.transpose(0, 1), self.weight.transpose(1, 2))
        return out.transpose(0, 1)

    def project(self, x, direction):
        """direction . forward(x) for a direction of size out_features: (batch_size, K).
        Computed as (weight^T direction) . x + bias . direction, so it costs
        O(K * in_features * out_features) per call, not per sample."""
        folded = torch.matmul(direction, self.weight)
        return (x * folded).sum(dim=-1) + self.bias.matmul(direction)


class BranchOutputCache:
    """Maps each embedding tensor made by a training-mode forward to its BranchOutputs.

    Entries are keyed by the identity of the embedding tensor and held through a
    weak reference: an entry disappears with its embedding tensor, and at most
    ``max_entries`` live entries are kept (the oldest is dropped first). It is never
    copied or pickled with its owner (a copy starts empty).
    """

    def __init__(self, max_entries):
        checks.check_positive_int("max_entries", max_entries)
        self.max_entries = max_entries
        self.entries = collections.OrderedDict()

    def add(self, embeddings, outputs):
        key = id(embeddings)
        self.entries[key] = (weakref.ref(embeddings, lambda _, key=key: self.entries.pop(key, None)), outputs)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)

    def find(self, embeddings):
        ref, outputs = self.entries.get(id(embeddings), (None, None))
        if ref is not None and ref() is embeddings:
            return outputs
        if not self.entries:
            raise RuntimeError(
                "RelationalLoss found no branch outputs: call the RelationalEmbedder in training mode "
                "(embedder.train()) on the batch before calling the loss. Eval-mode forwards record nothing."
            )
        raise RuntimeError(
            "RelationalLoss received embeddings that no recent training-mode forward of its "
            f"RelationalEmbedder produced (the last {self.max_entries} live outputs are kept). Pass the "
            "embedder's output tensor itself: a copy, slice, cast or normalised version of it, or the "
            "output of an eval-mode forward, has no branch outputs. Under DDP, call RelationalLoss on "
            "each rank's own batch: DistributedLossWrapper's gathered batch is such a copy."
        )

    def __len__(self):
        return len(self.entries)

    def __getstate__(self):
        return {"max_entries": self.max_entries, "entries": collections.OrderedDict()}


# "Deep Relational Metric Learning" (Zheng et al., ICCV 2021); official code:
# zbr17/DRML, src/drml/models/relation_embedder.py
class RelationalEmbedder(torch.nn.Module):
    """The DRML relational head, used as a PML ``embedder``.

    The trunk feature h (batch_size, in_features) is split into num_branches
    contiguous chunks h_k. Branch k has a node n_k = normalize(node_k(h_k)), two
    edge projections a_k, b_k of the detached h_k and a decoder of the detached
    node. A shared score function gives score_ij = relu(w_s . (a_i - b_j) + b_s),
    the scores are normalised over the source i (column normalisation, a column
    of zeros gives a zero message), the message to node j is u_j = sum_i A_ij n_i
    and a shared integrator gives o_j = W_int [n_j; u_j] + b_int. The output is
    [o_1 | ... | o_K] of size embedding_size (not normalised).

    embedding_size is the size of that output, num_branches * branch_size, so
    the module replaces a ``Linear(in_features, embedding_size)`` embedder; both
    in_features and embedding_size must be divisible by num_branches.

    The integrator starts at [I | 0], so at initialisation the output is the
    concatenation of the normalised nodes. In eval mode the module is a plain
    features -> embeddings function. In training mode it also records the
    branch nodes and reconstruction errors (BranchOutputs) for the output
    tensor in ``branch_output_cache``, where RelationalLoss finds them.
    """

    def __init__(self, in_features, embedding_size, num_branches=4, max_cached_forwards=8):
        super().__init__()
        checks.check_positive_int("in_features", in_features)
        checks.check_positive_int("embedding_size", embedding_size)
        checks.check_positive_int("num_branches", num_branches)
        checks.check_positive_int("max_cached_forwards", max_cached_forwards)
        if in_features % num_branches != 0:
            raise ValueError(
                f"in_features={in_features} must be divisible by num_branches={num_branches}: "
                "the trunk feature is split into num_branches equal chunks"
            )
        if embedding_size % num_branches != 0:
            raise ValueError(
                f"embedding_size={embedding_size} must be divisible by num_branches={num_branches}: "
                "embedding_size is the total output size, num_branches * branch_size"
            )
        self.in_features = in_features
        self.embedding_size = embedding_size
        self.num_branches = num_branches
        self.branch_in_features = in_features // num_branches
        self.branch_size = embedding_size // num_branches
        K, n_in, E = num_branches, self.branch_in_features, self.branch_size

        self.nodes = BranchLinear(K, n_in, E)
        self.a_edges = BranchLinear(K, n_in, E)
        self.b_edges = BranchLinear(K, n_in, E)
        self.decoders = BranchLinear(K, E, n_in)
        self.score = torch.nn.Linear(E, 1)
        self.integrator = torch.nn.Linear(2 * E, E)
        with torch.no_grad():
            torch.nn.init.normal_(self.score.weight, std=math.sqrt(2))
            self.score.bias.zero_()
            self.integrator.weight.copy_(torch.cat([torch.eye(E), torch.zeros(E, E)], dim=1))
            self.integrator.bias.zero_()
        self.branch_output_cache = BranchOutputCache(max_cached_forwards)

    def forward(self, features):
        self.check_features(features)
        h = features.reshape(len(features), self.num_branches, self.branch_in_features)
        h_detached = h.detach()
        nodes = torch.nn.functional.normalize(self.nodes(h), dim=-1)

        # score_ij = relu(w_s . (a_i - b_j) + b_s) = relu(w_s . a_i - w_s . b_j + b_s): the score
        # function is linear, so it is applied to the edge projections a, b before the difference
        # (BranchLinear.project), which never forms a or b themselves
        w_s = self.score.weight.squeeze(0)
        alpha = self.a_edges.project(h_detached, w_s) + self.score.bias
        beta = self.b_edges.project(h_detached, w_s)
        scores = torch.relu(alpha.unsqueeze(2) - beta.unsqueeze(1))
        adjacency = scores / scores.sum(dim=1, keepdim=True).clamp_min(1e-12)
        # u_j = sum_i A_ij n_i as a broadcast sum: K is small, faster than B tiny matmuls
        messages = (adjacency.unsqueeze(-1) * nodes.unsqueeze(2)).sum(dim=1)
        embeddings = self.integrator(torch.cat([nodes, messages], dim=-1)).flatten(1)

        if self.training:
            reconstruction = self.decoders(nodes.detach())
            errors = (h_detached - reconstruction).square().mean(dim=-1)
            self.branch_output_cache.add(embeddings, BranchOutputs(nodes, errors))
        return embeddings

    def branch_outputs(self, embeddings):
        """The BranchOutputs recorded for ``embeddings``, an output tensor of a
        training-mode forward of this module; a clear error otherwise."""
        return self.branch_output_cache.find(embeddings)

    def check_features(self, features):
        if not torch.is_tensor(features):
            raise TypeError(f"features must be a torch.Tensor, got {type(features).__name__}")
        if not features.is_floating_point():
            raise TypeError(f"features must be a floating point tensor, got dtype {features.dtype}")
        if features.ndim != 2 or features.shape[1] != self.in_features:
            raise ValueError(
                f"features must have shape (batch_size, in_features={self.in_features}), "
                f"got shape {tuple(features.shape)}"
            )
        if features.shape[0] == 0:
            raise ValueError("features is empty (batch size 0)")

    def extra_repr(self):
        return (
            f"in_features={self.in_features}, embedding_size={self.embedding_size}, "
            f"num_branches={self.num_branches}"
        )
