import math

import pytest
import torch

from resdecay import alpha_schedule, effective_decay, solve_alpha_min
from resdecay.schedule import SCHEDULES


def test_linear_is_authors_subblock_spacing():
    a = alpha_schedule(12, 0.6)
    assert a.shape == (12, 2)
    assert a[0, 0].item() == 1.0 and a[-1, 1].item() == 0.6  # exact end points
    assert torch.allclose(a.reshape(-1), torch.linspace(1, 0.6, 24, dtype=torch.float64))
    step = (1 - 0.6) / 23
    assert torch.allclose(a.reshape(-1), 1 - torch.arange(24, dtype=torch.float64) * step)


def test_paper_eq5_one_alpha_per_block():
    a = alpha_schedule(12, 0.6, "paper")
    expected = 1 - torch.arange(1, 13, dtype=torch.float64) * 0.4 / 12
    assert torch.allclose(a[:, 0], expected) and torch.all(a[:, 1] == 1.0)
    assert a[-1, 0].item() == 0.6
    # paper-notes §1: eq. 5 at L=12 would give 4.7e-2 for alpha_min 0.6
    assert effective_decay(a) == pytest.approx(4.68e-2, rel=0.01)


@pytest.mark.parametrize("alpha_min,depth,table", [
    (0.6, 12, 3.6e-3), (0.6, 18, 2.2e-4), (0.6, 24, 1.3e-5),
    (0.7, 12, 1.8e-2), (0.7, 18, 2.4e-3), (0.7, 24, 3.2e-4),
    (0.8, 12, 7.6e-2), (0.8, 18, 2.1e-2), (0.8, 24, 5.7e-3),
    (0.9, 12, 2.9e-1), (0.9, 18, 1.6e-1), (0.9, 24, 8.3e-2),
])
def test_alpha_eff_matches_paper_notes_table(alpha_min, depth, table):
    # the table gives two significant digits (0.155 is printed as 0.16, 3.15e-4 as 3.2e-4)
    assert effective_decay(alpha_schedule(depth, alpha_min)) == pytest.approx(table, rel=0.035)


def test_cosine_and_constant():
    c = alpha_schedule(6, 0.7, "cosine").reshape(-1)
    assert c[0].item() == 1.0 and c[-1].item() == 0.7
    assert torch.all(c[1:] <= c[:-1])  # monotone
    assert torch.all(alpha_schedule(6, 0.7, "constant") == 0.7)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_all_schedules_monotone_and_one_is_plain(schedule):
    a = alpha_schedule(8, 1.0, schedule)
    assert torch.all(a == 1.0)
    flat = alpha_schedule(8, 0.5, schedule).reshape(-1)
    assert torch.all(flat <= 1.0) and torch.all(flat >= 0.5)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("depth,target", [(24, 5e-3), (12, 1e-3), (18, 0.3)])
def test_solve_alpha_min_round_trip(schedule, depth, target):
    a_min = solve_alpha_min(depth, target, schedule)
    assert 0 < a_min <= 1
    assert effective_decay(alpha_schedule(depth, a_min, schedule)) == pytest.approx(target, rel=1e-6)


def test_solve_known_value():
    # the example: which alpha_min gives alpha_eff 5e-3 at depth 24?
    a_min = solve_alpha_min(24, 5e-3)
    assert 0.79 < a_min < 0.80
    assert solve_alpha_min(12, 1.0) == 1.0


@pytest.mark.parametrize("call,match", [
    (lambda: alpha_schedule(12, 0.0), "alpha_min must lie in"),
    (lambda: alpha_schedule(12, 1.2), "alpha_min must lie in"),
    (lambda: alpha_schedule(12, -0.5), "alpha_min must lie in"),
    (lambda: alpha_schedule(0, 0.6), "depth must be a positive integer"),
    (lambda: alpha_schedule(12, 0.6, "sigmoid"), "unknown schedule"),
    (lambda: solve_alpha_min(12, 0.0), "unreachable"),
    (lambda: solve_alpha_min(12, 2.0), "unreachable"),
    (lambda: solve_alpha_min(0, 1e-3), "depth must be a positive integer"),
])
def test_bad_arguments_raise_value_error_with_sentence(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_effective_decay_is_product():
    a = alpha_schedule(3, 0.5)
    assert effective_decay(a) == pytest.approx(math.prod(a.reshape(-1).tolist()))
