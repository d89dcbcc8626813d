"""The :class:`~dpaudit_torch.audit.monitors.MonitorContext` an auditor hands its monitors: the
configuration, the secret coins, the noise-audit coordinates and what the adapter knows about the
training (sample rate, dataset size, tensor names and groups, the accountant's view)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..canaries import SecretCoins
from .config import AuditConfig
from .monitors import MonitorContext


def monitor_context(cfg: AuditConfig, tap: Any, device: torch.device,
                    warn: Callable[[str], None], coins: SecretCoins,
                    noise_coords: tuple[torch.Tensor, torch.Tensor],
                    steps_at_attach: Callable[[], int]) -> MonitorContext:
    """The context of every monitor of one auditor. ``tap`` is the framework adapter
    (:class:`~dpaudit_torch.opacus_tap.OpacusTap`); ``steps_at_attach`` is read when a monitor
    asks for the accountant's history (it changes when a checkpoint is restored)."""

    def epsilon_of_sigma(sigma: float, steps: int) -> float:
        return tap.accountant.epsilon_for(sigma, tap.sample_rate, steps, cfg.delta)

    groups = tap.tensor_groups()
    noise_tensor = noise_coords[0].numpy()
    return MonitorContext(
        config=cfg, k_pairs=cfg.k_pairs, m_canaries=cfg.m_canaries, device=device,
        warn=warn, coins=coins, sample_rate=tap.sample_rate,
        epsilon_of_sigma=epsilon_of_sigma, n_records=tap.n_records,
        noise_tensor=noise_tensor,
        noise_group=np.asarray(groups, dtype=np.int64)[noise_tensor],
        tensor_names=tap.tensor_names(),
        group_names=[f"group {g}" for g in range(max(groups) + 1)],
        accountant_history=lambda: tap.accountant.history_since(steps_at_attach()),
        epsilon_of_history=lambda h: tap.accountant.epsilon_of_history(h, cfg.delta))
