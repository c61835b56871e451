"""What the powerful-benchmarker tests share: skipping when pb's stack or npm is absent."""

import importlib.util
import shutil

import pytest


def pb_skip(*modules):
    """(the missing modules of ``modules``, a skip mark for a test module that needs them)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    mark = pytest.mark.skipif(
        bool(missing),
        reason=f"the pb integration needs {', '.join(missing)} (not installed): pip install "
        "'pml-fieldlosses[pb]' and pip install --no-deps powerful-benchmarker==0.9.33, see docs/benchmarker.md",
    )
    return missing, mark


def npm_skip():
    """A skip mark for tests on the emoji data where npm (which builds it) is missing."""
    return pytest.mark.skipif(
        shutil.which("npm") is None, reason="the emoji data is built with npm (not found): install Node.js"
    )


# The primary metric as pb's records name it: in a trial's row (bayes_opt table) and in an
# experiment's fold-mean records (MeanAggregator tables, "_level0" suffix).
METRIC = "mean_average_precision_at_r"
VAL_MEANS = "MeanAggregator_accuracies_normalized_GlobalEmbeddingSpaceTester_level_0_VAL_vs_self"


def check_trial_value(experiment, trial_row, read_rows):
    """A Bayesian-optimisation trial's objective is what its experiment recorded: the fold
    mean and SEM of the validation MAP@R at the selected epochs (the last "trained" row of
    its meta records), in [0, 1]. With the tests' 6 or 12 validation classes (2 images each) 0
    is a possible value, so an exact comparison is the test, not a lower bound."""
    trained = [r for r in read_rows(experiment / "meta_logs" / "saved_csvs" / "logs.db", VAL_MEANS)
               if r["trained_status"] == "trained"]  # fmt: skip
    assert trained, f"{experiment} has no trained fold mean"
    assert 0 <= trial_row[METRIC] <= 1 and trial_row[f"SEM_{METRIC}"] >= 0
    assert trial_row[METRIC] == pytest.approx(trained[-1][f"{METRIC}_level0"], abs=1e-12)
    assert trial_row[f"SEM_{METRIC}"] == pytest.approx(trained[-1][f"SEM_{METRIC}_level0"], abs=1e-12)
