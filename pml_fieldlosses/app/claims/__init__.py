"""``pml-fieldlosses claims``: the papers' claims, each tested by the experiment
its table entry names, with the bench's protocol, runs and seeds.

from pml_fieldlosses.app.claims import claims_config, run_claims
run_claims(claims_config(quick=True), ids=["pfml-alpha"])

table.py: the claims (one entry each); verdict.py: the rule; measures.py: the
values of the runs and the evaluation; run.py: the command (the runs through the
bench's pipeline); report.py and plots.py: the report.
"""

from .run import claims_config, run_claims
from .table import CLAIMS, get_claims, validate

__all__ = ["CLAIMS", "claims_config", "get_claims", "run_claims", "validate"]
