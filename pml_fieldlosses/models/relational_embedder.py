import collections
import math

import torch

from ..utils import checks
from ..utils.loss_utils import UnitRows, scale_rows_for_normalize, unit_rows, upcast_half

BranchOutputs = collections.namedtuple("BranchOutputs", ["nodes", "errors", "version"])
BranchOutputs.__doc__ = """Side outputs of one training-mode forward of a RelationalEmbedder,
attached to the embeddings it returns as ``embeddings.branch_outputs``.

nodes: (batch_size, num_branches, branch_size), the unit-norm branch nodes n_k
(differentiable w.r.t. the trunk and the node layers).
errors: (batch_size, num_branches), the per-sample reconstruction errors e_k
(differentiable w.r.t. the decoders only).
version: the embeddings' ``_version`` when they were made; an in-place change
of the embeddings makes the outputs stale (branch_outputs_of refuses them).
None for embeddings made under torch.inference_mode(): such tensors have no
version counter, so an in-place change of them is not noticed."""

NO_BRANCH_OUTPUTS = (
    "{name} carry no branch outputs (no `branch_outputs` attribute). RelationalLoss needs the output "
    "tensor of a training-mode forward of a RelationalEmbedder itself (embedder.train()): eval-mode "
    "outputs carry none, nor does any new tensor made from the output: a copy, slice, detach, a cast "
    "to another dtype or device, a normalised version, DDP's gathered batch (DistributedLossWrapper) "
    "or the gathered output of DataParallel over several GPUs. Under DDP, call RelationalLoss on each "
    "rank's own batch."
)


def branch_outputs_of(embeddings, name="embeddings"):
    """The BranchOutputs a training-mode forward of RelationalEmbedder attached to
    ``embeddings`` (``embeddings.branch_outputs``); a RuntimeError saying which
    tensor is needed if there are none or the embeddings changed in place since."""
    outputs = getattr(embeddings, "branch_outputs", None)
    if not isinstance(outputs, BranchOutputs):
        raise RuntimeError(NO_BRANCH_OUTPUTS.format(name=name))
    if outputs.version is not None and version_of(embeddings) != outputs.version:
        raise RuntimeError(
            f"{name} were modified in place after the RelationalEmbedder's forward (tensor version "
            f"{version_of(embeddings)}, {outputs.version} when made): their branch outputs no longer "
            "match them. Modify a copy instead (e.g. embeddings * 2, not embeddings.mul_(2))."
        )
    nodes, errors = outputs.nodes, outputs.errors
    if nodes.ndim != 3 or errors.shape != nodes.shape[:2] or nodes.shape[0] != len(embeddings):
        raise RuntimeError(
            f"{name}.branch_outputs do not fit {name} of shape {tuple(embeddings.shape)}: nodes "
            f"{tuple(nodes.shape)}, errors {tuple(errors.shape)} (expected (batch, K, E) and (batch, K))"
        )
    return outputs


def known_finite(embeddings):
    """True if ``embeddings`` is a training-mode output of a RelationalEmbedder, unchanged in
    place since: the head returns only finite outputs (it raises otherwise), so a loss need not
    scan them for NaN/inf again. False for anything else, and for outputs made under
    torch.inference_mode() (no version counter: an in-place change is not noticed)."""
    outputs = getattr(embeddings, "branch_outputs", None)
    return (
        torch.is_tensor(embeddings)
        and isinstance(outputs, BranchOutputs)
        and outputs.version is not None
        and version_of(embeddings) == outputs.version
    )


def version_of(tensor):
    """The tensor's version counter (``_version``, bumped by every in-place change), or None
    for a tensor made under torch.inference_mode(), which has none."""
    return None if tensor.is_inference() else tensor._version


def smallest_eps(dtype):
    """1e-12, the official code's floor for norms and sums, or the dtype's smallest normal
    number where 1e-12 is not representable (float16: 1e-12 rounds to 0 there, and 0/0 = NaN)."""
    return max(1e-12, torch.finfo(dtype).tiny)


def normalize_rows(x, rescale=False):
    """x / max(||x||, eps) over the last dimension (torch's normalize) and the norms. With
    rescale, rows whose sum of squares would overflow are first divided by a power of two
    (exact, and x / ||x|| does not depend on the scale): the exact unit rows for any finite
    magnitude, where the plain norms overflow to inf and give zero rows."""
    if rescale:
        x = scale_rows_for_normalize(x.reshape(-1, x.shape[-1])).reshape(x.shape)
    if fast_path(x):
        return UnitRows.apply(x, smallest_eps(x.dtype))
    return unit_rows(x, smallest_eps(x.dtype))


def fast_path(x):
    """True where the hand-written backwards apply: float32/float64 outside autocast (under
    autocast the plain ops run, in the dtypes autocast gives them)."""
    return x.dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled(x.device.type)


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
        if fast_path(x):
            return BranchLinearFunction.apply(x, self.weight, self.bias)
        return branch_linear(x, self.weight, self.bias)


def projections(x, layers, direction):
    """direction . layer(x) for each BranchLinear in layers, side by side: (batch_size, K,
    len(layers)). Computed as (weight^T direction) . x + bias . direction, so it costs
    O(K * in_features * out_features) per layer, not per sample."""
    K = x.shape[1]
    # one (1, out) x (out, in) product per branch and layer; matmul of a vector with the (K, out, in)
    # weight expands and copies it first, which costs more than the product itself
    folded = torch.cat([torch.bmm(direction.expand(K, 1, -1), layer.weight) for layer in layers], dim=1)
    offsets = torch.stack([layer.bias.matmul(direction) for layer in layers], dim=1)  # (K, layers)
    # then one (layers, in) x (in, batch) product per branch, x read in place as a transposed matrix
    # (a strided view) and once for all the layers, forward and backward: cheaper than
    # (x * folded).sum(dim=-1), which passes over x twice per layer each way
    products = torch.baddbmm(offsets.unsqueeze(2), folded, x.permute(1, 2, 0))  # (K, layers, batch)
    # in (batch, K) order in memory: the scores made from them are then laid out plainly, which
    # the messages' batched product (over the batch) needs to run at full speed
    return products.permute(2, 0, 1).contiguous()


def branch_linear(x, weight, bias):
    """(batch, K, in) -> (batch, K, out): x[:, k] weight[k]^T + bias[k], one batched product."""
    return torch.baddbmm(bias.unsqueeze(1), x.transpose(0, 1), weight.transpose(1, 2)).transpose(0, 1)


class BranchLinearFunction(torch.autograd.Function):
    """branch_linear with a backward that computes each gradient in its own tensor's layout.
    Autograd of the plain ops computes the weight's gradient as (K, in, out) blocks (the
    transposed weight is the product's operand), copied afterwards into the (K, out, in)
    weight, and the input's as (K, batch, in), copied again where the trunk features'
    (batch, K * in) reshape is undone: two copies and a slower product. No double backward."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return branch_linear(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad = grad.transpose(0, 1)  # (K, batch, out)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.new_empty(x.shape)  # (batch, K, in), the products written into it in place
            torch.bmm(grad, weight, out=grad_x.transpose(0, 1))
        if ctx.needs_input_grad[1]:
            grad_weight = torch.bmm(grad.transpose(1, 2), x.transpose(0, 1))
        if ctx.needs_input_grad[2]:
            grad_bias = grad.sum(dim=1)
        return grad_x, grad_weight, grad_bias


class ReconstructionError(torch.autograd.Function):
    """errors[b, k] = mean_i (h[b, k, i] - (weight[k] nodes[b, k] + bias[k])_i)^2, the
    squared reconstruction errors of the decoders (a BranchLinear's weight and bias) for
    the detached h and nodes, differentiable w.r.t. weight and bias only.

    The same values as the plain ops, with a leaner backward: autograd of the plain ops
    goes through four (batch, K, in) elementwise steps (square, mean, difference, and the
    scaling of each) before the decoders' products; here the error gradient g scales the
    (batch, K, E) nodes instead, and two batched products give
    grad weight[k] = sum_b diff[b, k] (c[b, k] nodes[b, k])^T and grad bias[k] = sum_b c[b, k] diff[b, k],
    with c = -2 g / in. For float32/float64 outside autocast (the half-precision path keeps
    the plain ops); no double backward."""

    @staticmethod
    def forward(ctx, h, nodes, weight, bias):
        nodes = nodes.transpose(0, 1)  # (K, batch, E)
        # diff = (h - bias) - weight nodes, (K, batch, in): the product subtracted in place by
        # the batched product itself, one temporary of that size and one pass to make it
        diff = torch.sub(h.transpose(0, 1), bias.unsqueeze(1)).baddbmm_(
            nodes, weight.transpose(1, 2), alpha=-1
        )
        ctx.save_for_backward(nodes, diff)
        # the sum of squares of each row in one pass (a dot product), then the mean
        return torch.linalg.vecdot(diff, diff).div_(diff.shape[-1]).transpose(0, 1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        nodes, diff = ctx.saved_tensors
        scale = grad.transpose(0, 1).mul(-2 / diff.shape[-1]).unsqueeze(2)  # (K, batch, 1)
        grad_weight = grad_bias = None
        if ctx.needs_input_grad[2]:
            grad_weight = torch.bmm(diff.transpose(1, 2), scale * nodes)
        if ctx.needs_input_grad[3]:
            grad_bias = torch.bmm(scale.transpose(1, 2), diff).squeeze(1)
        return None, None, grad_weight, grad_bias


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
    features -> embeddings function. In training mode it also attaches the
    branch nodes and reconstruction errors to the output tensor, as
    ``embeddings.branch_outputs`` (a BranchOutputs), where RelationalLoss finds them.
    """

    def __init__(self, in_features, embedding_size, num_branches=4):
        super().__init__()
        checks.check_positive_int("in_features", in_features)
        checks.check_positive_int("embedding_size", embedding_size)
        checks.check_positive_int("num_branches", num_branches)
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

    def forward(self, features):
        self.check_features(features)
        if features.dtype != self.nodes.weight.dtype:
            # half features under autocast: their gradient comes back in their dtype, inf where
            # it overflows it (a GradScaler then skips the step and lowers its scale)
            features = upcast_half(features)
        embeddings, nodes, errors, norms = self.compute(features)
        # one device synchronisation: all outputs finite and no node norm overflowed (which
        # gives a zero node) if their sum is finite (one pass each; a NaN or inf propagates);
        # otherwise, check each (a sum of huge finite values may overflow by itself), and
        # compute features too large for the plain norms again, rescaled
        total = embeddings.detach().sum() + norms.detach().sum()
        if errors is not None:
            total = total + errors.detach().sum()
        if not torch.isfinite(total):
            if torch.isfinite(features).all() and not torch.isfinite(norms).all():
                embeddings, nodes, errors, _ = self.compute(features, rescale=True)
            self.check_outputs(features, embeddings, errors)
        if self.training:
            # a plain attribute: it stays with this tensor object (and with what returns the same
            # object, e.g. .to() to its own dtype); any new tensor made from it has none
            embeddings.branch_outputs = BranchOutputs(nodes, errors, version_of(embeddings))
        return embeddings

    def compute(self, features, rescale=False):
        """The forward (docs/derivations.md, 'The relational head (DRML)'): embeddings,
        nodes, norms of the node pre-activations and (training mode) the reconstruction
        errors; rescale: see normalize_rows."""
        h = features.reshape(len(features), self.num_branches, self.branch_in_features)
        h_detached = h.detach()
        nodes, norms = normalize_rows(self.nodes(h), rescale)

        # score_ij = relu(w_s . (a_i - b_j) + b_s) = relu(w_s . a_i - w_s . b_j + b_s): the score
        # function is linear, so it is applied to the edge projections a, b before the difference
        # (projections), which never forms a or b themselves
        edges = projections(h_detached, [self.a_edges, self.b_edges], self.score.weight.squeeze(0))
        # (unbind: one backward step for both columns, where two selections take five)
        alpha, beta = edges.unbind(-1)
        alpha = alpha + self.score.bias
        scores = torch.relu(alpha.unsqueeze(2) - beta.unsqueeze(1))
        adjacency = scores / scores.sum(dim=1, keepdim=True).clamp_min(smallest_eps(scores.dtype))
        # u_j = sum_i A_ij n_i, one batched product (a broadcast sum over the sources forms the
        # (batch, K, K, E) products and costs about 3x more, forward and backward; einsum makes
        # the same product with a dozen more steps around it)
        messages = torch.bmm(adjacency.transpose(1, 2), nodes)
        embeddings = self.integrator(torch.cat([nodes, messages], dim=-1)).flatten(1)

        errors = None
        if self.training and not torch.is_autocast_enabled(features.device.type):
            errors = ReconstructionError.apply(
                h_detached, nodes.detach(), self.decoders.weight, self.decoders.bias
            )
        elif self.training:
            reconstruction = self.decoders(nodes.detach())
            # in at least float32: a squared error of float16 values overflows from about 256
            errors = (upcast_half(h_detached) - upcast_half(reconstruction)).square().mean(dim=-1)
        return embeddings, nodes, errors, norms

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
        weight = self.nodes.weight
        if features.device != weight.device:
            raise ValueError(
                f"features are on {features.device} but the head's parameters on {weight.device}: "
                f"move one of them (features.to('{weight.device}') or embedder.to('{features.device}'))"
            )
        if self.training and weight.dtype not in (torch.float32, torch.float64):
            raise TypeError(
                f"the head's parameters are {weight.dtype}: train it with float32 (or float64) parameters, "
                f"under torch.autocast for half precision (embedder.float()); a {weight.dtype} head is for "
                "inference (eval mode) only: its updates and gradients (e.g. the 1/eps slope of "
                "normalising a zero node) do not fit the dtype"
            )
        # the head computes in its parameters' dtype, or under autocast in the autocast dtype;
        # autocast leaves float64 alone, so float64 must then be on both sides or on neither
        autocast = torch.is_autocast_enabled(features.device.type)
        if features.dtype != weight.dtype and (
            not autocast or torch.float64 in (features.dtype, weight.dtype)
        ):
            raise TypeError(
                f"features have dtype {features.dtype} but the head's parameters are {weight.dtype}"
                + (" under torch.autocast, which does not cast float64" if autocast else "")
                + f": cast the features (features.to({weight.dtype})) or the head "
                f"(embedder.to({features.dtype}))"
                + ("" if autocast else ", or call the head under torch.autocast")
            )

    def check_outputs(self, features, embeddings, errors):
        """A clear error instead of NaN/inf outputs."""
        finite = torch.isfinite(embeddings).all()
        if errors is not None:
            finite = finite & torch.isfinite(errors).all()
        if finite:
            return
        if not torch.isfinite(features).all():
            raise ValueError("features contain NaN or inf values")
        if errors is not None and not torch.isfinite(errors).all():
            where = f"the reconstruction error (a mean of squared differences) overflows {errors.dtype}"
        else:
            where = f"the edge scores (features times edge weights) overflow {embeddings.dtype}"
        largest = features.detach().abs().max().item()
        raise ValueError(
            f"features are too large for the head (largest |feature| {largest:.3g}): {where}. "
            "Scale the trunk's output down (e.g. end the trunk with a BatchNorm or LayerNorm)."
        )

    def extra_repr(self):
        return (
            f"in_features={self.in_features}, embedding_size={self.embedding_size}, "
            f"num_branches={self.num_branches}"
        )
