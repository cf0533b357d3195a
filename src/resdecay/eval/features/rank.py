"""Effective rank of a feature set (paper eq. 6).

rho = -sum_i p_i log p_i with p_i = sigma_i / sum_j sigma_j, where sigma_i are the singular
values of the sample covariance. Those are the squared singular values of the centred feature
matrix, so we never form the covariance (nor an N x N Gram matrix): one SVD of (N, D) features.
The paper uses rho itself (an entropy, between 0 and log D); ``exp=True`` gives Roy & Vetterli's
effective rank exp(rho) (between 1 and D).
"""

from __future__ import annotations

import torch


@torch.no_grad()
def effective_rank(feats: torch.Tensor, exp: bool = False) -> float:
    """Effective rank of a set of features, the paper's eq. 6: rho = -sum_i p_i log p_i with
    p_i = sigma_i / sum_j sigma_j over the singular values sigma_i of the features' sample covariance.

    Computed in float64 from one SVD of the centred (N, D) features (the covariance's singular values are
    their squares up to a constant that p_i cancels), so neither the D x D covariance nor an N x N Gram
    matrix is formed. Features whose covariance is zero (all rows equal) have rank 0 (1 with ``exp``).

    Args:
        feats: (N, D) features, one row per image, N >= 2; any float dtype and device.
        exp: return Roy & Vetterli's effective rank exp(rho), between 1 and min(N - 1, D), instead of
            the paper's entropy rho, between 0 and log min(N - 1, D).

    Returns:
        rho (or exp(rho)) as a Python float.

    Raises:
        ValueError: ``feats`` is not 2-D or has fewer than two rows.
    """
    if feats.ndim != 2 or len(feats) < 2:
        raise ValueError(f"effective_rank needs (N, D) features with N >= 2, got {tuple(feats.shape)}")
    x = feats.double()
    x = x - x.mean(0, keepdim=True)
    s = torch.linalg.svdvals(x) ** 2  # covariance spectrum up to a constant that p_i cancels
    total = s.sum()
    if total <= 0:
        return 1.0 if exp else 0.0
    p = s / total
    p = p[p > 0]
    rho = float(-(p * p.log()).sum())
    return float(torch.tensor(rho).exp()) if exp else rho
