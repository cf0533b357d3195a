"""The attentive probe heads against the originals: efficient-probing's EP (``poolings/ep.py`` at b8f4fb8) and
V-JEPA's ``AttentivePooler`` (facebookresearch/jepa ``src/models/attentive_pooler.py`` at 51c59d5).

``data/probing_reference.pt`` holds, per head, what the original module gave in float64 on random tokens (2 x 6 x 16):
its state dict (weights moved off their init by N(0, 0.1) noise), the output, and the gradients of sum(output * w)
with respect to every parameter and to the tokens. It was made by importing the two files from those commits
and running them; neither repository is needed here. V-JEPA's cross-attention builds an output projection its
forward never applies: the reference has no gradient for it, and neither does ours."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from resdecay.eval.probing.heads import AttentivePooler, EfficientProbing, ep_probe

REFERENCE = torch.load(Path(__file__).parent / "data" / "probing_reference.pt", weights_only=True)
BUILD = {"ep_q4_d2": lambda: EfficientProbing(16, num_queries=4, d_out=2),
         "ep_q8_d1": lambda: EfficientProbing(16, num_queries=8, d_out=1),
         "jepa_depth1": lambda: AttentivePooler(16, num_heads=4, depth=1),
         "jepa_depth4": lambda: AttentivePooler(16, num_heads=4, depth=4)}


@pytest.mark.parametrize("name", list(BUILD))
def test_forward_and_gradients_equal_the_original(name):
    ref = REFERENCE[name]
    head = BUILD[name]().double()
    head.load_state_dict(ref["state"], strict=True)  # the same parameter names as the original
    tokens = ref["tokens"].clone().requires_grad_(True)
    out = head(tokens)
    torch.testing.assert_close(out, ref["out"], rtol=1e-12, atol=1e-12)
    (out * ref["weight"]).sum().backward()
    torch.testing.assert_close(tokens.grad, ref["grad_tokens"], rtol=1e-12, atol=1e-12)
    grads = {k: p.grad for k, p in head.named_parameters() if p.grad is not None}
    assert set(grads) == set(ref["grads"])  # V-JEPA's unused cross-attention projection gets none in either
    for k, g in grads.items():
        torch.testing.assert_close(g, ref["grads"][k], rtol=1e-12, atol=1e-12, msg=k)


def test_ep_probe_is_pooling_batchnorm_linear_of_the_pooled_width():
    probe = ep_probe(32, 10, num_queries=4, d_out=2)
    assert [type(m).__name__ for m in probe] == ["EfficientProbing", "BatchNorm1d", "Linear"]
    assert probe[1].affine is False and probe[1].eps == 1e-6 and probe[2].in_features == 16
    assert probe(torch.randn(5, 7, 32)).shape == (5, 10)


@pytest.mark.parametrize("make", [lambda: EfficientProbing(32, num_queries=5), lambda: EfficientProbing(32, d_out=3),
                                  lambda: AttentivePooler(30, num_heads=4), lambda: AttentivePooler(32, depth=0)])
def test_shapes_that_cannot_split_are_refused(make):
    with pytest.raises(ValueError):
        make()
