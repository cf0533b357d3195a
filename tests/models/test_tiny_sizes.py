"""The tests size their small models with ``helpers.tiny_config``, on the registry's tiny sizes
(``resdecay.models.TINY``). Numbers asserted elsewhere (step counts, parameter counts, losses) were written against
these sizes, so a change of a tiny size fails here first, by name, instead of as numbers drifting across the suite."""

import pytest

from helpers import TINY, model_overrides, tiny_config


@pytest.mark.parametrize("family,sizes", [
    ("mae", dict(img_size=16, in_chans=3, patch_size=4, embed_dim=32, depth=4, num_heads=2, decoder_embed_dim=32,
                 decoder_depth=2, decoder_num_heads=2)),
    ("sit", dict(img_size=8, in_chans=4, patch_size=2, embed_dim=32, depth=4, num_heads=2, num_classes=10,
                 alpha_min=0.8)),
    ("uvit", dict(img_size=8, patch_size=2, embed_dim=32, depth=5, num_heads=2, num_classes=10, alpha_min=0.7)),
])
def test_the_tiny_sizes_the_tests_were_written_against(family, sizes):
    cfg = tiny_config(family)
    assert cfg.family == family
    assert {k: getattr(cfg, k) for k in sizes} == sizes


def test_overrides_win_and_run_overrides_name_only_the_keys_asked_for():
    assert tiny_config("mae", depth=6, img_size=8).depth == 6
    assert tiny_config("mae") == tiny_config("mae")  # a fresh config each time, equal by value
    assert model_overrides("uvit", keys=("embed_dim", "depth"), depth=3) == ["model.embed_dim=32", "model.depth=3"]
    assert TINY[:6] == ["model.embed_dim=32", "model.depth=4", "model.num_heads=2", "model.decoder_embed_dim=32",
                        "model.decoder_depth=2", "model.decoder_num_heads=2"]
    # ``family`` may be overridden too (the validation tests pass a wrong one on purpose)
    assert tiny_config("sit", family="uvit").family == "uvit"
