"""Upstream kit: ``python -m pml_fieldlosses.app.upstream PATH_TO_PML_CHECKOUT`` writes our
losses, their helpers, unittest files and docs into a pytorch-metric-learning checkout,
by a mechanical transform of our current sources, and prints a pull-request
description. See docs/upstream.md."""

from .kit import apply, main, pr_description

__all__ = ["apply", "main", "pr_description"]
