"""Every loss of the package, built for given (num_classes, embedding_size), for
the property-based, precision and determinism tests."""

from pml_fieldlosses import losses

ALL_LOSSES = {
    "MeanFieldContrastive": lambda C, D: losses.MeanFieldContrastiveLoss(C, D, mf_reg_weight=0.1),
    "ClassWiseMultiSimilarity": lambda C, D: losses.ClassWiseMultiSimilarityLoss(),
    "MeanFieldClassWiseMultiSimilarity": lambda C, D: losses.MeanFieldClassWiseMultiSimilarityLoss(
        C, D, mf_reg_weight=0.1
    ),
    "PotentialField": lambda C, D: losses.PotentialFieldLoss(C, D),
    "ContrastivePotential": lambda C, D: losses.ContrastivePotentialLoss(C, D),
}
