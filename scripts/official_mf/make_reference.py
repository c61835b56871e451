"""Reference values of the official mean-field losses, for tests/test_exactness.py.

Runs the official implementation of "Mean Field Theory in Deep Metric
Learning" (https://github.com/st-tech/mft-in-dml, code/loss/*.py) in float64
on fixed, seeded inputs and writes the inputs, the loss values and the
gradients (embeddings and mean fields) as JSON. Nothing of that repository is
copied here: this script imports it from a checkout given on the command line.

    git clone https://github.com/st-tech/mft-in-dml /tmp/mft-in-dml
    python scripts/official_mf/make_reference.py /tmp/mft-in-dml

The official modules import only torch (and, through code/loss/__init__.py,
pytorch-metric-learning). Their masks are built in torch's default dtype, so
the default dtype is set to float64 for the whole run.

Mean fields are stored in our layout (num_classes, embedding_size); the
official W is the transpose.
"""

import argparse
import importlib
import json
import pathlib
import subprocess
import sys

import torch

DEFAULT_OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "official_mf_reference.json"

# (name, official class, hyperparameters as the official constructor names them)
LOSSES = [
    (
        "MeanFieldContrastive",
        "MeanFieldContrastiveLoss",
        dict(pos_margin=0.02, neg_margin=0.3, mf_reg=0.0, mf_power=2),
    ),
    (
        "MeanFieldContrastive_reg",
        "MeanFieldContrastiveLoss",
        dict(pos_margin=0.1, neg_margin=0.9, mf_reg=0.5, mf_power=2),
    ),
    (
        "MeanFieldClassWiseMultiSimilarity",
        "MeanFieldClassWiseMultiSimilarityLoss",
        dict(alpha=0.01, beta=80.0, base=0.8, mf_reg=0.0, mf_power=2),
    ),
    (
        "MeanFieldClassWiseMultiSimilarity_reg",
        "MeanFieldClassWiseMultiSimilarityLoss",
        dict(alpha=2.0, beta=10.0, base=0.5, mf_reg=0.3, mf_power=3),
    ),
    ("ClassWiseMultiSimilarity", "ClassWiseMultiSimilarityLoss", dict(alpha=0.01, beta=80.0, base=0.8)),
    ("ClassWiseMultiSimilarity_other", "ClassWiseMultiSimilarityLoss", dict(alpha=2.0, beta=10.0, base=0.5)),
]

# (name, seed, batch size, embedding size, num classes, labels or None for a seeded draw)
INPUTS = [
    ("random", 0, 16, 8, 6, None),
    ("absent_classes", 1, 8, 5, 9, [0, 0, 2, 2, 2, 5, 5, 1]),
    ("singletons", 2, 7, 4, 5, [4, 0, 1, 1, 3, 3, 3]),
    ("single_class", 3, 5, 6, 4, [2, 2, 2, 2, 2]),
]


def load_official(checkout):
    code = pathlib.Path(checkout).resolve() / "code"
    if not (code / "loss" / "base_mean_field_loss.py").is_file():
        sys.exit(f"{checkout} is not a checkout of st-tech/mft-in-dml (no code/loss/base_mean_field_loss.py)")
    sys.path.insert(0, str(code))
    return importlib.import_module("loss"), code.parent


def make_inputs(seed, batch_size, embedding_size, num_classes, labels):
    g = torch.Generator().manual_seed(seed)
    if labels is None:
        labels = torch.randint(0, num_classes, (batch_size,), generator=g).tolist()
    x = torch.randn(batch_size, embedding_size, generator=g, dtype=torch.float64) * 3
    mean_fields = torch.randn(num_classes, embedding_size, generator=g, dtype=torch.float64)
    return x, labels, mean_fields


def run_case(official, class_name, kwargs, x, labels, mean_fields):
    x = x.clone().requires_grad_()
    y = torch.tensor(labels)
    if class_name == "ClassWiseMultiSimilarityLoss":
        loss = getattr(official, class_name)(**kwargs)(x, y)
        (grad_x,) = torch.autograd.grad(loss, [x])
        return loss.item(), grad_x, None
    loss_fn = getattr(official, class_name)(mean_fields.shape[0], mean_fields.shape[1], **kwargs)
    with torch.no_grad():
        loss_fn.W.copy_(mean_fields.t())
    loss = loss_fn(x, y)
    grad_x, grad_w = torch.autograd.grad(loss, [x, loss_fn.W])
    return loss.item(), grad_x, grad_w.t()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", help="path to a checkout of https://github.com/st-tech/mft-in-dml")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON file to write (default: %(default)s)")
    args = parser.parse_args()

    torch.set_default_dtype(torch.float64)
    official, root = load_official(args.checkout)
    commit = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()  # "unknown" for a checkout that is not a git work tree
    cases = []
    for loss_name, class_name, kwargs in LOSSES:
        for input_name, seed, batch_size, embedding_size, num_classes, labels in INPUTS:
            x, y, mean_fields = make_inputs(seed, batch_size, embedding_size, num_classes, labels)
            value, grad_x, grad_w = run_case(official, class_name, kwargs, x, y, mean_fields)
            case = dict(
                loss=loss_name,
                official_class=class_name,
                hyperparameters=kwargs,
                inputs=input_name,
                seed=seed,
                shape=dict(batch_size=batch_size, embedding_size=embedding_size, num_classes=num_classes),
                labels=y,
                embeddings=x.tolist(),
                value=value,
                grad_embeddings=grad_x.tolist(),
            )
            if grad_w is not None:
                case.update(mean_fields=mean_fields.tolist(), grad_mean_fields=grad_w.tolist())
            cases.append(case)
    data = dict(
        source="https://github.com/st-tech/mft-in-dml",
        commit=commit or "unknown",
        dtype="float64",
        torch=torch.__version__,
        generator="scripts/official_mf/make_reference.py",
        cases=cases,
    )
    pathlib.Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
