"""The bootstrap directory of ``dpaudit run`` (:mod:`dpaudit_torch.launch`).

``dpaudit run`` puts this directory first on the ``PYTHONPATH`` of the script it runs, so that
every Python process of that script (DDP workers started by ``torchrun`` included) imports its
``sitecustomize`` at start-up. Nothing here is imported by ``import dpaudit_torch``.
"""
