"""powerful-benchmarker (pb) 0.9.33 integration: our losses, the DRML head and our
datasets/trunks in the MLRC runner, on PML 2.x, record-keeper >= 0.9.32, numpy 2 and
the current ax-platform.

Importing this package imports powerful_benchmarker (install the ``[pb]`` extra);
``import pml_fieldlosses`` never imports it. Nothing is patched until the launcher
(``pml-fieldlosses-pb``, ``python -m pml_fieldlosses.app.benchmarker``) runs. See
docs/benchmarker.md.
"""

from .launcher import main
from .registration import register

__all__ = ["main", "register"]
