"""decayify keeps its alphas and pending inputs on each module, so copies are independent (issue 13, bug 4)."""

import copy
import threading

import pytest
import timm
import torch
import torchvision

from resdecay import alphas_of, decayify
from resdecay.errors import UserError


def tiny_vit():
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=4).eval()


def test_model_and_deepcopy_run_concurrently_in_threads():
    model = decayify(tiny_vit(), alpha_min=0.5)
    twin = copy.deepcopy(model)  # as EMA and torch.compile copy a model
    # each model gets its own inputs, so a pending input taken from the other thread shows
    data = {id(m): [torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(10 * k + i)) for i in range(3)]
            for k, m in enumerate((model, twin))}
    with torch.no_grad():
        ref = {key: [m(x) for x in data[key]] for key, m in ((id(model), model), (id(twin), twin))}
    errors = []
    barrier = threading.Barrier(2)

    def work(m):
        try:
            barrier.wait()
            with torch.no_grad():
                for _ in range(25):
                    for x, want in zip(data[id(m)], ref[id(m)], strict=True):
                        if not torch.equal(m(x), want):
                            errors.append("output differs from the single-threaded reference")
        except Exception as e:  # a KeyError from a shared pending input, before the fix
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(m,)) for m in (model, twin)]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        torch.set_num_threads(before)
    assert not errors, errors[:3]


def test_changing_alpha_on_a_copy_leaves_the_original_alone():
    model = decayify(tiny_vit(), alpha_min=0.6)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
        twin = copy.deepcopy(model)
        assert torch.equal(twin(x), before)
        decayify(twin, alpha_min=0.3)  # re-decayify the copy
        assert torch.equal(model(x), before) and not torch.allclose(twin(x), before)
        twin2 = copy.deepcopy(model)
        twin2.blocks[1].drop_path1.resdecay_alpha = 0.1  # or set one alpha by hand
        assert torch.equal(model(x), before) and not torch.allclose(twin2(x), before)
    assert alphas_of(model) != alphas_of(twin) and alphas_of(twin2)[1][1][0] == 0.1
    assert list(twin.state_dict()) == list(model.state_dict())  # keys untouched


def test_resnet_copy_is_independent():
    torch.manual_seed(0)
    model = decayify(torchvision.models.resnet18(num_classes=10).eval(), alpha_min=0.7)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
        twin = decayify(copy.deepcopy(model), alpha_min=0.2)
        assert torch.equal(model(x), before) and not torch.allclose(twin(x), before)
    assert alphas_of(model)[2][1][0] == pytest.approx(alphas_of(decayify(copy.deepcopy(model), 0.7))[2][1][0])


def test_redecayify_to_one_restores_the_plain_model_exactly():
    plain = tiny_vit()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = plain(x)
        model = decayify(copy.deepcopy(plain), alpha_min=0.5)
        assert not torch.allclose(model(x), want)
        decayify(model, alpha_min=1.0)
        assert torch.equal(model(x), want)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_jit_script_is_refused_in_one_line():
    model = decayify(tiny_vit(), alpha_min=0.6)
    with pytest.raises(UserError) as info:
        torch.jit.script(model)
    assert "\n" not in str(info.value) and "torch.compile" in str(info.value)
    torch.jit.script(decayify(tiny_vit(), alpha_min=1.0))  # no hooks: scripts as timm's model
