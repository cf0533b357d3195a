"""model.mask_ratio must leave at least one visible and one masked patch (issue 13, bug 8)."""

import pytest

from helpers import assert_one_line_error, run
from resdecay.models import MAEConfig


@pytest.mark.parametrize("ratio,visible", [("0.95", "0 of 16"), ("0.99", "0 of 16"), ("0", "16 of 16"), ("0.0", "16 of 16")])
def test_cli_refuses_ratios_without_visible_or_masked_patches(capsys, ratio, visible):
    # mae-tiny-digits: 8x8 images, patch 2 -> 16 patches; 0.95 keeps int(0.8) = 0 of them
    code, _, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--print-config", f"model.mask_ratio={ratio}")
    assert_one_line_error(code, err, f"model.mask_ratio {float(ratio)}", f"leaves {visible} patches visible", "at most 0.9375")


@pytest.mark.parametrize("ratio", [0.01, 0.5, 0.9375])
def test_ratios_that_keep_and_remove_a_patch_pass(ratio):
    MAEConfig(img_size=8, patch_size=2, embed_dim=32, num_heads=2, decoder_embed_dim=32, decoder_num_heads=2,
              mask_ratio=ratio).validate()


def test_suggested_bound_is_valid_for_awkward_patch_counts():
    # 28 / 4 -> 49 patches: 1 - 1/49 rounded *down* must still keep a patch
    cfg = MAEConfig(img_size=28, patch_size=4, embed_dim=32, num_heads=2, decoder_embed_dim=32, decoder_num_heads=2,
                    mask_ratio=0.99)
    with pytest.raises(ValueError, match="at most 0.9795") as info:
        cfg.validate()
    cfg.mask_ratio = float(str(info.value).rsplit(" ", 1)[1])
    cfg.validate()
