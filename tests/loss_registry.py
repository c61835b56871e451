"""Our losses (those on a plain embedder) from the one loss table
(pml_fieldlosses.app.catalog), at their published defaults, keyed by class name
without "Loss", for the property-based, precision and determinism tests; the
mean-field regulariser (off by default) is on so that they exercise it."""

from pml_fieldlosses.app import catalog

ALL_LOSSES = catalog.ours_by_class_name(mf_reg_weight=0.1)
