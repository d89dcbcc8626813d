"""Statistics layer: pure tensors in, numbers out. Never imports Opacus."""
