"""Auxiliary objectives on a diffusion transformer's hidden states, beside its denoising loss.

* REPA (Yu et al., "Representation Alignment for Generation", ICLR 2025): the tokens of one block, through
  a trained MLP projector, are pulled towards a frozen encoder's patch tokens of the clean image. The loss
  is the negative cosine similarity per token, averaged over tokens and the batch (sihyun-yu/REPA
  ``loss.py``); the projector is ``build_mlp`` of its ``models/sit.py``: Linear-SiLU-Linear-SiLU-Linear,
  2048 wide in the paper.
* Dispersive loss (Wang & He 2025, "Diffuse and Disperse"): a repulsion among the batch's hidden states,
  no encoder and no positive pairs. Its InfoNCE-L2 variant is ``log mean_{i,j} exp(-||h_i - h_j||^2 / tau)``
  over every ordered pair of the batch (the diagonal's zeros included), each sample's tokens flattened into
  one vector and the squared distance divided by that vector's length (whaletech-ai/Disperse-Loss
  ``transport/transport.py``, ``disp_loss``; its tau is that length: ``tau`` here multiplies it).

Both are plain functions of tensors; ``train/aux_objective.py`` captures the hidden states and adds them
to the training loss.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

REPA_PROJECTOR_DIM = 2048  # REPA models/sit.py: projector_dim=2048
REPA_WEIGHT = 0.5  # REPA train.py --proj-coeff 0.5 (the paper's lambda)
DISPERSIVE_WEIGHT = 0.25  # Disperse-Loss transport.py: terms['loss'] += 0.25 * disp_loss
DISPERSIVE_TAU = 1.0  # Disperse-Loss: squared distances divided by the feature length alone


def repa_projector(width: int, hidden: int, out: int) -> nn.Sequential:
    """REPA's ``build_mlp``: ``width`` (the diffusion model's) -> ``hidden`` -> ``hidden`` -> ``out`` (the
    encoder's), SiLU between; every Linear xavier-uniform with zero bias, as REPA's SiT initialises it
    (its ``_basic_init`` reaches the projectors too)."""
    mlp = nn.Sequential(nn.Linear(width, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, out))
    for layer in mlp:
        if isinstance(layer, nn.Linear):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
    return mlp


def repa_loss(projected: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Negative cosine similarity of ``projected`` (B, N, C) and ``target`` (B, N, C) token by token, averaged
    over the N tokens of each image and then over the batch: REPA's ``proj_loss`` for one encoder. In
    [-1, 1]; -1 is perfect alignment. Computed in float32 (cosines of bf16 tokens lose their last digits)."""
    if projected.shape != target.shape:
        raise ValueError(f"REPA aligns token for token: projected tokens {tuple(projected.shape)} vs the encoder's "
                         f"{tuple(target.shape)}")
    cos = (F.normalize(projected.float(), dim=-1) * F.normalize(target.float(), dim=-1)).sum(dim=-1)  # (B, N)
    return -cos.mean(dim=1).mean()


def dispersive_loss(hidden: torch.Tensor, tau: float = DISPERSIVE_TAU) -> torch.Tensor:
    """The InfoNCE-L2 dispersive loss of a batch of hidden states (B, ...): each sample flattened to a vector
    of length L, D_ij = ||h_i - h_j||^2 / (L tau) over all B^2 ordered pairs (i = j included, D = 0), and
    ``log mean exp(-D)``. At most 0 (all samples equal); lower when the batch spreads out. A log-sum-exp,
    so that far-apart batches do not underflow to log 0."""
    z = hidden.flatten(1).float()
    # exact differences, not the |a|^2 + |b|^2 - 2ab expansion cdist uses by default (cancellation near 0)
    d = torch.cdist(z, z, compute_mode="donot_use_mm_for_euclid_dist").pow(2) / (z.shape[1] * tau)
    return torch.logsumexp(-d.flatten(), dim=0) - math.log(d.numel())


__all__ = ["DISPERSIVE_TAU", "DISPERSIVE_WEIGHT", "REPA_PROJECTOR_DIM", "REPA_WEIGHT", "dispersive_loss", "repa_loss",
           "repa_projector"]
