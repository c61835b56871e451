"""``python -m pml_fieldlosses.app.benchmarker``: the same as ``pml-fieldlosses-pb``. The
package imports powerful_benchmarker (the ``[pb]`` extra); the console script checks for it first."""

from .launcher import main

main()
