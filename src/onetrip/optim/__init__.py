"""Optimizers whose step is a few multi-tensor Triton launches.

    from onetrip.optim import AdamW
    opt = AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, master_weights=True)
"""

from .adamw import AdamW

__all__ = ["AdamW"]
