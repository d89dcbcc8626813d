"""Integrations with training frameworks (optional extras), one module each, never imported by
``import dpaudit_torch``: :mod:`~dpaudit_torch.integrations.lightning` (PyTorch Lightning) and
:mod:`~dpaudit_torch.integrations.transformers` (the Hugging Face ``Trainer``)."""
