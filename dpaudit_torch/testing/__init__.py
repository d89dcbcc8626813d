"""Helpers for testing audits: deliberately broken DP optimizers (:mod:`.bugs`)."""
