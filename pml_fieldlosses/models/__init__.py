"""Embedder modules to use as PML's ``models["embedder"]``."""

from .relational_embedder import BranchOutputs, RelationalEmbedder

__all__ = ["BranchOutputs", "RelationalEmbedder"]
