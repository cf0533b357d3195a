"""A block only the traced adapter reaches (a user's own, its branch computed inline), shared by the traced adapter's
tests and the coverage table's "a user's gated stack" row."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class GatedBlock(nn.Module):
    """A user's block whose branch is computed inline: x + sigmoid(gate(x)) * dropout(f(norm(x))), the dropout
    a function reading ``self.training`` (fixed while tracing: one generated forward per mode)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.norm, self.f, self.gate = nn.LayerNorm(d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return x + torch.sigmoid(self.gate(x)) * F.dropout(self.f(self.norm(x)), 0.2, self.training)
