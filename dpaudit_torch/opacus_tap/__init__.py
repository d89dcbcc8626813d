"""The Opacus adapter: the only package of dpaudit_torch that imports Opacus or names one of its
private members (:class:`OpacusTap`; injection, observation, accountant view, DDP)."""

from .accountant import AccountantView
from .injection import Injector
from .observation import GradientReader
from .plan import StepPlan, effective_noise_multiplier, is_ghost
from .tap import OWNER_ATTR, OpacusTap

__all__ = ["AccountantView", "Injector", "StepPlan", "GradientReader", "OpacusTap", "OWNER_ATTR",
           "effective_noise_multiplier", "is_ghost"]
