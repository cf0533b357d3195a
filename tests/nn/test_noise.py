"""``train.noise_scope``: the draws of a training step per rank (the default, unchanged) or for the effective batch
(``nn/noise.py``), where rank r of W keeps rows r::W of the whole batch's draw whatever W is."""

import torch

from resdecay.models import build_model, get_family
from resdecay.nn.noise import draw, global_batch_noise
from resdecay.train.config import load_config


def test_outside_a_scope_a_draw_is_the_process_generators_own():
    torch.manual_seed(3)
    a = draw(lambda n: torch.rand(n, 5), 4)
    torch.manual_seed(3)
    assert torch.equal(a, torch.rand(4, 5))


def test_each_rank_keeps_its_rows_of_the_whole_batch_whatever_the_process_count():
    whole = [None] * 3
    for world, batch in ((1, 8), (2, 4), (4, 2), (8, 1)):
        for rank in range(world):
            with global_batch_noise(seed=5, step=7, micro=0, rank=rank, world=world):
                rows = [draw(lambda n: torch.randn(n, 3), batch), draw(lambda n: torch.rand(n, 2), batch),
                        draw(lambda n: torch.randint(0, 1000, (n,)), batch)]
            for i, r in enumerate(rows):  # position j of rank r is position j * world + r of the whole batch
                if whole[i] is None:
                    whole[i] = r
                assert torch.equal(r, whole[i][rank::world]), (world, rank, i)
    before = torch.get_rng_state()
    with global_batch_noise(seed=5, step=8, micro=0, rank=0, world=1):
        other = draw(lambda n: torch.randn(n, 3), 8)
    assert not torch.equal(other, whole[0])  # another step, another draw
    assert torch.equal(torch.get_rng_state(), before)  # the process's own generator is left as it was


def test_an_mae_and_a_sit_step_split_over_two_ranks_add_up_to_the_one_rank_loss():
    for preset, n in (("mae-tiny-digits", 8), ("sit-tiny-fmnist", 4)):
        cfg = load_config(preset, ["model.depth=2"])
        torch.manual_seed(0)
        model = build_model(cfg.model).train()
        images = torch.randn(n, cfg.model.in_chans, cfg.model.img_size, cfg.model.img_size)
        labels = torch.arange(n) % 10
        objective = get_family(cfg.model.family).objective
        with global_batch_noise(0, 3, 0, 0, 1):
            one = objective(model, images, labels)
        halves = []
        for rank in range(2):
            with global_batch_noise(0, 3, 0, rank, 2):
                halves.append(objective(model, images[rank::2], labels[rank::2]))
        torch.testing.assert_close(sum(halves) / 2, one, rtol=1e-5, atol=1e-6, msg=preset)


def test_a_resume_on_another_process_count_is_exact_only_at_the_same_effective_batch_with_global_noise():
    from resdecay.train.run.previous_run import inexact_changes

    def cfg(batch, scope):
        return {"data": {}, "train": {"batch_size": batch, "accum_steps": 1, "noise_scope": scope}}

    assert inexact_changes(cfg(8, "global"), cfg(16, "global"), 4, 2) == []  # 4 x 8 -> 2 x 16
    assert inexact_changes(cfg(8, "global"), cfg(8, "global"), 4, 2) == ["processes 4 -> 2"]  # 32 -> 16 images a step
    assert inexact_changes(cfg(8, "rank"), cfg(16, "rank"), 4, 2) == ["train.batch_size 8 -> 16", "processes 4 -> 2"]
    accumulated = {"data": {}, "train": {"batch_size": 8, "accum_steps": 2, "noise_scope": "global"}}
    # 4 x 8 x 1 -> 2 x 8 x 2: the same 32 images a step, but the draws are grouped by micro-step: not exact
    assert inexact_changes(cfg(8, "global"), accumulated, 4, 2) == ["train.accum_steps 1 -> 2", "processes 4 -> 2"]
