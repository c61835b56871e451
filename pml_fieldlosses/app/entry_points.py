"""The console scripts of pyproject.toml, each behind the check that its extra is installed.

``pml-fieldlosses`` (the bench, select and claims) and ``pml-fieldlosses-pb`` (the MLRC
runner) exit with one line naming the pip command of a missing extra (``extras.require``)
instead of a ModuleNotFoundError traceback; the command's modules are imported only after
the check, so a bug of ours still shows its traceback.
"""

from .extras import FAISS_EXTRA, require


def bench_main():
    """``pml-fieldlosses``: the bench (``app.cli``)."""
    require("pml-fieldlosses", ["bench", FAISS_EXTRA])
    from .cli import main

    return main()


def pb_main():
    """``pml-fieldlosses-pb``: the MLRC runner (``app.benchmarker``)."""
    require("pml-fieldlosses-pb", ["pb", FAISS_EXTRA], pb=True)
    from .benchmarker import main

    return main()
