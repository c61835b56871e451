"""``pml-fieldlosses bench``: every loss on the same footing, on real data, with a report.

from pml_fieldlosses.app.bench import BenchConfig, run_bench
rows = run_bench(BenchConfig(losses=("ProxyAnchor", "MFCWMS"), seeds=3))

protocol.py: the settings, the class split and the label noise. pipeline.py: a plan of
runs -> results (data, protocol check, inputs, backend, resume, wall time), which the
commands drive: benchmark.py (``bench``), selection.py (``select``) and the claims
(app.claims). runs.py, run.py, baseline.py: the runs; scheduler.py and ray_backend.py:
where they go; features.py: their inputs; result.py: their files; report.py, figures.py
and plots.py: the report.
"""

from .benchmark import run_bench
from .protocol import BenchConfig, quick_config

__all__ = ["BenchConfig", "quick_config", "run_bench"]
