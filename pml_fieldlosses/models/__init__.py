"""Embedder modules to use as PML's ``models["embedder"]``."""

from .relational_embedder import BranchOutputs, RelationalEmbedder, branch_outputs_of

__all__ = ["BranchOutputs", "RelationalEmbedder", "branch_outputs_of"]
