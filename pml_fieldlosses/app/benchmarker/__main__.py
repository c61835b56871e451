"""``python -m pml_fieldlosses.app.benchmarker``: the same as ``pml-fieldlosses-pb``, with the same
one-line message when an extra it needs (faiss) is missing."""

from ..extras import FAISS_EXTRA, require
from .launcher import main

require("python -m pml_fieldlosses.app.benchmarker", ["pb", FAISS_EXTRA], pb=True)
main()
