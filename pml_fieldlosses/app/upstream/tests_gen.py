"""PML unittest files for our losses, with the naive references of our test suite.

The references are the functions of tests/naive.py and tests/naive_potential.py (explicit
loops written from the spec) that the case's reference call needs, followed
transitively, copied from our current sources by ast (nothing is kept here). Each test
compares value and gradients (embeddings and the loss's learnable parameter) with the
reference in float64, for every dtype of PML's TEST_DTYPES on its TEST_DEVICE.
"""

import ast
import builtins
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .sources import KitError, map_mentions

REFERENCE_FILES = ("naive.py", "naive_potential.py")


@dataclass
class Case:
    kwargs: str  # constructor arguments (C classes, D dimensions)
    reference: str  # the naive loss from x (B, D) float64, y (list), W (the parameter, float64)
    parameter: Optional[str] = None  # the learnable parameter's attribute
    shape: str = ""  # its shape


# Hyperparameters that make every term matter at this scale (those of our exactness tests).
# The potential losses with dense=False: at this size they would take their dense path
# (the spec's sum as written), and the scalable one is what needs the naive reference.
CASES = {
    "MeanFieldContrastiveLoss": Case(
        "C, D, pos_margin=0.1, neg_margin=0.9, mf_reg_weight=0.5",
        "mean_field_contrastive(x, y, W, 0.1, 0.9, 0.5, 2)",
        "mean_fields",
        "(C, D)",
    ),
    "ClassWiseMultiSimilarityLoss": Case(
        "alpha=2.0, beta=10.0, base=0.5", "class_wise_multi_similarity(x, y, 2.0, 10.0, 0.5)"
    ),
    "MeanFieldClassWiseMultiSimilarityLoss": Case(
        "C, D, alpha=2.0, beta=10.0, base=0.5, mf_reg_weight=0.3, mf_reg_power=3",
        "mean_field_class_wise_multi_similarity(x, y, W, 2.0, 10.0, 0.5, 0.3, 3)",
        "mean_fields",
        "(C, D)",
    ),
    "PotentialFieldLoss": Case(
        "C, D, proxies_per_class=2, delta=0.8, alpha=2.0, dense=False",
        "sum(naive_pfml(x, y, W, 0.8, 2.0))",
        "proxies",
        "(C, 2, D)",
    ),
    "ContrastivePotentialLoss": Case(
        "C, D, proxies_per_class=2, delta=0.6, repulsion_delta=1.2, dense=False",
        "sum(naive_cpml(x, y, W, 0.6, 1.2))",
        "proxies",
        "(C, 2, D)",
    ),
}

TEMPLATE = '''import unittest

import torch

from pytorch_metric_learning.losses import {name}

from .. import TEST_DEVICE, TEST_DTYPES

# Naive references: explicit loops over samples, classes and pairs, from the equations.
{references}


# (rtol, atol) per dtype; float16 inputs are computed in float32 by the loss
TOLERANCE = {{torch.float16: (1e-2, 1e-3), torch.float32: (1e-4, 1e-6), torch.float64: (1e-12, 1e-15)}}
LABELS = [
    [0, 0, 2, 2, 2, 5, 5, 1],  # absent classes
    [0, 0, 1, 1, 4, 3, 3, 3],  # a singleton class
    [6, 6, 6, 6, 6],  # one class
    [3],  # one sample
]
C, D = 9, 6
TORCH_VERSION = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])


def reference(x, y, W):
    return {reference}


@unittest.skipIf(TORCH_VERSION < (2, 0), "needs torch >= 2.0 (Tensor.scatter_reduce)")
class Test{name}(unittest.TestCase):
    def assert_close(self, actual, expected, dtype):
        """In float64; atol grows with the largest expected entry."""
        rtol, atol = TOLERANCE[dtype]
        actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
        atol = atol + rtol * expected.abs().max().item()
        self.assertTrue(torch.allclose(actual, expected, rtol=rtol, atol=atol), (actual, expected))

    def test_{snake}(self):
        generator = torch.Generator().manual_seed(0)
        for dtype in TEST_DTYPES:
            for y in LABELS:
                x = torch.randn(len(y), D, generator=generator, dtype=torch.float64) * 3
                x = x.to(dtype)
                loss_func = {name}({kwargs}).to(TEST_DEVICE)
                inputs = [x.to(TEST_DEVICE).requires_grad_()]
{set_parameter}
                loss = loss_func(inputs[0], torch.tensor(y, device=TEST_DEVICE))
                grads = torch.autograd.grad(loss, inputs)

                x64 = x.double().requires_grad_()
                expected_inputs = [x64]{expected_parameter}
                expected = reference(x64, y, {w})
                expected_grads = torch.autograd.grad(expected, expected_inputs)
                self.assert_close(loss, expected, dtype)
                for grad, expected_grad in zip(grads, expected_grads):
                    self.assert_close(grad, expected_grad, dtype)


if __name__ == "__main__":
    unittest.main()
'''

SET_PARAMETER = """                # the learnable parameter, never below float32
                W = torch.randn({shape}, generator=generator, dtype=torch.float64)
                parameter = loss_func.{parameter}
                parameter.data = W.to(TEST_DEVICE, torch.promote_types(dtype, torch.float32))
                inputs.append(parameter)"""


def snake(name):
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


def reference_functions(tests_dir, call):
    """Source of the top-level definitions of our reference files that ``call`` needs,
    in file order."""
    definitions = {}  # name -> (order, node, file, its source text)
    order = 0
    for filename in REFERENCE_FILES:
        text = Path(tests_dir, filename).read_text()
        for node in ast.parse(text).body:
            names = []
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            for name in names:
                definitions[name] = (order, node, filename, ast.get_source_segment(text, node))
            order += 1
    needed, todo = {}, [ast.parse(call)]
    while todo:
        for sub in ast.walk(todo.pop()):
            if isinstance(sub, ast.Name) and sub.id in definitions and sub.id not in needed:
                needed[sub.id] = definitions[sub.id]
                todo.append(definitions[sub.id][1])
    missing = {
        n.id
        for n in ast.walk(ast.parse(call))
        if isinstance(n, ast.Name) and n.id not in definitions and not hasattr(builtins, n.id)
        and n.id not in ("x", "y", "W")
    }
    if missing:
        raise KitError(f"the reference call {call!r} needs {sorted(missing)}, not defined in {REFERENCE_FILES}")
    nodes = sorted({id(v[1]): v for v in needed.values()}.values(), key=lambda v: v[0])
    return "\n\n\n".join(map_mentions(segment, f"tests/{filename}") for _, _, filename, segment in nodes)


def test_file(name, tests_dir):
    case = CASES[name]
    references = reference_functions(tests_dir, case.reference)
    if case.parameter:
        set_parameter = SET_PARAMETER.format(shape=case.shape, parameter=case.parameter)
        expected_parameter, w = "\n                W = W.requires_grad_()\n                expected_inputs.append(W)", "W"
    else:
        set_parameter, expected_parameter, w = "", "", "None"
    source = TEMPLATE.format(
        name=name,
        references=references,
        reference=case.reference,
        snake=snake(name).removesuffix("_loss"),
        kwargs=case.kwargs,
        set_parameter=set_parameter,
        expected_parameter=expected_parameter,
        w=w,
    )
    ast.parse(source, feature_version=(3, 8))
    return source


def loss_factory(name):
    """(class, a function building it as the case's test does), from our losses."""
    import pml_fieldlosses.losses as ours

    loss_class = getattr(ours, name)
    return loss_class, lambda: eval(f"cls({CASES[name].kwargs})", {"cls": loss_class, "C": 9, "D": 6})
