"""Diffusion objectives and samplers: closed forms, oracle losses, exact landings, guidance, errors."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from torch import nn

from resdecay.diffusion import (
    DDPM,
    SAMPLERS,
    LinearInterpolant,
    beta_schedule,
    cached_objective,
    diffusion_loss,
    make_scheduler,
    objective_for,
    sample,
    save_npz,
    to_uint8,
)
from resdecay.errors import ConfigError, UserError

DDPM_SAMPLERS = ["ddpm", "ddim", "dpm-solver++"]
INTERP_SAMPLERS = ["euler", "heun", "euler-maruyama", "dopri5"]


def make_cfg(objective="ddpm-eps", noise_schedule="linear", num_classes=0, class_dropout=0.0):
    return types.SimpleNamespace(objective=objective, noise_schedule=noise_schedule, num_classes=num_classes,
                                 class_dropout=class_dropout)


class StandIn(nn.Module):
    """A tiny backbone honouring the contract model(x, t, y=None) -> same shape; records its calls."""

    def __init__(self, cfg, chans=2):
        super().__init__()
        self.cfg = cfg
        self.conv = nn.Conv2d(chans, chans, 3, padding=1)
        self.t_scale = nn.Parameter(torch.tensor(0.01))
        self.emb = nn.Embedding(cfg.num_classes + 1, chans) if cfg.num_classes else None
        self.calls = []

    def forward(self, x, t, y=None):
        assert t.shape == (x.shape[0],) and t.dtype == torch.float32
        self.calls.append(None if y is None else y.clone())
        out = self.conv(x) + self.t_scale * t.view(-1, 1, 1, 1)
        if self.emb is not None:
            out = out + self.emb(y)[:, :, None, None]
        return torch.tanh(out)


class Oracle(nn.Module):
    """The optimal prediction for data ~ N(mu, s^2) per coordinate; s = 0 is the single point x* = mu."""

    def __init__(self, objective, mu=0.3, s=0.0, schedule="linear"):
        super().__init__()
        self.cfg = make_cfg(objective, schedule)
        self.mu, self.s2 = mu, s * s
        self.ab = torch.from_numpy(DDPM(schedule).alphas_cumprod64)
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, x, t, y=None):
        x, mu, s2 = x.double(), self.mu, self.s2
        if self.cfg.objective == "interp-v":  # x_t = (1-t) x0 + t eps: v = E[eps|x_t] - E[x0|x_t]
            t = t.double().view(-1, 1, 1, 1)
            var, r = (1 - t) ** 2 * s2 + t ** 2, x - (1 - t) * mu
            return (t / var * r - (mu + (1 - t) * s2 / var * r)).float()
        ab = self.ab[t.round().long()].view(-1, 1, 1, 1)  # eps_hat = sqrt(1-ab) (x_t - sqrt(ab) mu) / var
        return ((1 - ab).sqrt() / (ab * s2 + 1 - ab) * (x - ab.sqrt() * mu)).float()


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ objectives
def test_beta_schedules_and_forward_process():
    from diffusers import DDPMScheduler

    for name, theirs in (("linear", "linear"), ("cosine", "squaredcos_cap_v2"), ("scaled-linear", "scaled_linear")):
        ddpm = DDPM(name)
        ref = DDPMScheduler(beta_schedule=theirs, **({"beta_start": 0.00085, "beta_end": 0.012}
                                                     if theirs == "scaled_linear" else {}))
        assert ddpm.betas.dtype == torch.float32 and ddpm.betas64.dtype == np.float64
        torch.testing.assert_close(ddpm.betas, ref.betas, rtol=1e-5, atol=1e-7)
        ab = ddpm.alphas_cumprod
        assert bool((ab > 0).all() and (ab < 1).all() and (ab[1:] < ab[:-1]).all())
    assert beta_schedule("linear")[[0, -1]].tolist() == pytest.approx([1e-4, 0.02])

    ddpm, x0, noise = DDPM("linear"), torch.randn(4, 2, 3, 3), torch.randn(4, 2, 3, 3)
    t = torch.tensor([0, 10, 500, 999])
    ab = torch.from_numpy(np.cumprod(1 - np.linspace(1e-4, 0.02, 1000)))[t].float().view(-1, 1, 1, 1)
    torch.testing.assert_close(ddpm.q_sample(x0, t, noise), ab.sqrt() * x0 + (1 - ab).sqrt() * noise)


def test_oracle_losses_are_zero():
    x0 = torch.randn(64, 2, 4, 4)
    ddpm = DDPM("cosine")

    def eps_oracle(x_t, t, y=None):  # knows x0, so recovers the true noise from (x_t, t)
        ab = ddpm.alphas_cumprod[t.long()].double().view(-1, 1, 1, 1)
        return ((x_t.double() - ab.sqrt() * x0) / (1 - ab).sqrt()).float()

    assert ddpm.loss(eps_oracle, x0).item() < 1e-8
    noise = torch.randn_like(x0)
    assert ddpm.loss(lambda x, t, y=None: noise, x0, t=torch.randint(0, 1000, (64,)), noise=noise).item() == 0.0

    path = LinearInterpolant()
    t = torch.rand(64) * 0.9 + 0.05
    x_t = path.interpolate(x0, t, noise)
    torch.testing.assert_close(path.target(x0, noise), noise - x0)
    torch.testing.assert_close(path.interpolate(x0, torch.zeros(64), noise), x0)
    torch.testing.assert_close(path.interpolate(x0, torch.ones(64), noise), noise)
    v = path.target(x0, noise)
    tb = t.view(-1, 1, 1, 1)
    torch.testing.assert_close(path.velocity_to_x0(x_t, tb, v), x0, atol=1e-5, rtol=0)
    torch.testing.assert_close(path.velocity_to_eps(x_t, tb, v), noise, atol=1e-5, rtol=0)
    v_oracle = lambda x, t, y=None: (x - x0) / t.view(-1, 1, 1, 1)  # noqa: E731  (x_t - x0)/t = eps - x0
    assert path.loss(v_oracle, x0, t=t, noise=noise).item() < 1e-10
    assert path.loss(lambda x, t, y=None: torch.zeros_like(x), x0).item() > 0.5


def test_noised_at_level():
    x0, noise = torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4)
    ddpm, path = DDPM("linear"), LinearInterpolant()
    x_t, t = ddpm.noised_at_level(x0, noise, 0.0)
    assert torch.equal(x_t, x0) and t.tolist() == [0.0] * 3
    x_t, t = ddpm.noised_at_level(x0, noise, 0.5)
    assert t.dtype == torch.float32 and t.tolist() == [500.0] * 3
    torch.testing.assert_close(x_t, ddpm.q_sample(x0, t, noise))
    assert ddpm.noised_at_level(x0, noise, 1.0)[1].tolist() == [999.0] * 3
    x_t, t = path.noised_at_level(x0, noise, 0.25)
    torch.testing.assert_close(x_t, 0.75 * x0 + 0.25 * noise)
    assert t.tolist() == [0.25] * 3


def test_diffusion_loss_reads_cfg_unwraps_and_caches():
    cond = StandIn(make_cfg("interp-v", num_classes=3, class_dropout=0.1))
    wrapped = types.SimpleNamespace(module=types.SimpleNamespace(_orig_mod=cond))  # DDP(compile(model)) stand-in
    images, labels = torch.randn(5, 2, 4, 4), torch.tensor([0, 1, 2, 0, 1])
    loss = diffusion_loss(cond, images, labels)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert cond.conv.weight.grad is not None and torch.equal(cond.calls[-1], labels)

    uncond = StandIn(make_cfg("ddpm-eps", "cosine"))
    diffusion_loss(uncond, images, labels)
    assert uncond.calls[-1] is None  # labels are passed only to class-conditional models
    from resdecay.diffusion.objectives import unwrap
    assert unwrap(wrapped) is cond
    assert cached_objective(uncond.cfg, "cpu") is cached_objective(uncond.cfg, torch.device("cpu"))
    assert isinstance(cached_objective(uncond.cfg, "cpu"), DDPM)
    assert cached_objective(uncond.cfg, "cpu").noise_schedule == "cosine"
    assert isinstance(objective_for(cond.cfg), LinearInterpolant)


# ------------------------------------------------------------------ samplers
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_every_sampler_returns_finite_samples(sampler):
    obj = SAMPLERS[sampler]
    model = StandIn(make_cfg(obj, num_classes=3, class_dropout=0.1))
    x, y = sample(model, 5, sampler=sampler, steps=50 if sampler == "dopri5" else 3, cfg_scale=2.0, image_shape=(2, 4, 4), generator=gen(),
                  batch_size=2, return_labels=True)
    assert x.shape == (5, 2, 4, 4) and torch.isfinite(x).all()
    assert y.shape == (5,) and y.dtype == torch.long and bool(((y >= 0) & (y < 3)).all())


@pytest.mark.parametrize("sampler", [s for s in SAMPLERS if s != "dopri5"])
@pytest.mark.parametrize("steps", [1, 7])
def test_samplers_land_on_a_single_data_point(sampler, steps):
    """Data = one point x*: eps_hat = (x_t - sqrt(ab) x*)/sqrt(1-ab) and v = (x_t - x*)/t are the exact
    optimal predictions; every x0 estimate is then x*, and each sampler's last step returns it.
    (Not dopri5: like SiT's, it evaluates v at t = 0, which for a point mass is 0/0.)"""
    x = sample(Oracle(SAMPLERS[sampler], mu=0.3), 6, sampler=sampler, steps=steps, image_shape=(1, 4, 4),
               generator=gen())
    assert (x - 0.3).abs().max().item() < 1e-3


@pytest.mark.parametrize("sampler,steps", [("ddpm", 250), ("ddim", 100), ("dpm-solver++", 25), ("euler", 100),
                                           ("heun", 25), ("euler-maruyama", 100), ("dopri5", 1000)])
def test_samplers_reproduce_a_gaussian(sampler, steps):
    """Data ~ N(0.3, 0.5^2) with the exact optimal predictor: samples have that mean and spread."""
    x = sample(Oracle(SAMPLERS[sampler], mu=0.3, s=0.5), 1000, sampler=sampler, steps=steps,
               image_shape=(1, 4, 4), generator=gen(1))
    assert abs(x.mean().item() - 0.3) < 0.02 and abs(x.std().item() - 0.5) < 0.03


def test_dopri5_follows_the_exact_probability_flow():
    """Data ~ N(mu, s^2): the interpolant's ODE flow is affine, x(t) = (1-t) mu + sigma_t x(1) with
    sigma_t^2 = (1-t)^2 s^2 + t^2, so each noise draw z must land on mu + s z. dopri5 at SiT's
    tolerances hits that to ~1e-4 in a few dozen evaluations; 10 Euler steps miss by 1e-2."""
    oracle, z = Oracle("interp-v", mu=0.3, s=0.5), torch.randn(4, 1, 4, 4, generator=gen(2))
    info = {}
    x = sample(oracle, 4, sampler="dopri5", steps=1000, image_shape=(1, 4, 4), generator=gen(2), info=info)
    assert (x - (0.3 + 0.5 * z)).abs().max().item() < 1e-3
    assert 10 <= info["nfe"] <= 200
    euler = sample(oracle, 4, sampler="euler", steps=10, image_shape=(1, 4, 4), generator=gen(2), info=info)
    assert info["nfe"] == 10 and (euler - (0.3 + 0.5 * z)).abs().max().item() > 1e-2
    loose = {}
    sample(oracle, 4, sampler="dopri5", steps=1000, image_shape=(1, 4, 4), generator=gen(2), info=loose, rtol=1e-1, atol=1e-2)
    tight = {}
    sample(oracle, 4, sampler="dopri5", steps=1000, image_shape=(1, 4, 4), generator=gen(2), info=tight, rtol=1e-5, atol=1e-7)
    assert loose["nfe"] < tight["nfe"]


def test_ddpm_samplers_use_the_training_betas_and_euler_matches_diffusers_flow_match():
    from diffusers import FlowMatchEulerDiscreteScheduler

    ddpm = DDPM("cosine")
    for name in DDPM_SAMPLERS:
        sched = make_scheduler(name, ddpm, 7)
        torch.testing.assert_close(sched.betas, ddpm.betas)
        assert sched.config.prediction_type == "epsilon"
    sched = make_scheduler("ddim", ddpm, 7)  # DDIM's step is T // steps = 142: grid ends at 141 -> alpha_bar 1
    sched.set_timesteps(7)
    assert sched.timesteps.tolist() == [993, 851, 709, 567, 425, 283, 141]

    model, steps = StandIn(make_cfg("interp-v")), 6
    ours = sample(model, 3, sampler="euler", steps=steps, image_shape=(2, 4, 4), generator=gen(3))
    fm = FlowMatchEulerDiscreteScheduler(shift=1.0)
    fm.set_timesteps(sigmas=np.linspace(1, 0, steps + 1)[:-1].tolist())
    x = torch.randn(3, 2, 4, 4, generator=gen(3))
    with torch.no_grad():
        for t in fm.timesteps:
            x = fm.step(model(x, (t / 1000).expand(3)), t, x).prev_sample
    torch.testing.assert_close(ours, x, atol=1e-5, rtol=1e-5)


def test_classifier_free_guidance():
    model = StandIn(make_cfg("interp-v", num_classes=3, class_dropout=0.1))
    kw = dict(sampler="heun", steps=4, image_shape=(2, 4, 4), labels=[0, 1, 2, 1])
    plain = sample(model, 4, generator=gen(), **kw)
    assert all(c is None or not bool((c == 3).any()) for c in model.calls)  # no null-label pass at scale 1
    model.calls.clear()
    near_one = sample(model, 4, cfg_scale=1.0 + 1e-6, generator=gen(), **kw)
    assert model.calls[0].tolist() == [0, 1, 2, 1, 3, 3, 3, 3]  # batch doubled with the null label
    torch.testing.assert_close(near_one, plain, atol=1e-4, rtol=0)  # uncond + 1 * (cond - uncond) = cond
    guided = sample(model, 4, cfg_scale=4.0, generator=gen(), **kw)
    assert (guided - plain).abs().max() > 1e-3

    class NullOnly(StandIn):  # always the null label: what guidance scale 0 must give
        def forward(self, x, t, y=None):
            return super().forward(x, t, torch.full_like(y, 3))

    null_model = NullOnly(model.cfg)
    null_model.load_state_dict(model.state_dict())
    torch.testing.assert_close(sample(model, 4, cfg_scale=0.0, generator=gen(), **kw),
                               sample(null_model, 4, generator=gen(), **kw))


@pytest.mark.parametrize("sampler", ["ddpm", "euler-maruyama"])
def test_determinism_and_train_mode_restored(sampler):
    model = StandIn(make_cfg(SAMPLERS[sampler], num_classes=3, class_dropout=0.1)).train()
    kw = dict(sampler=sampler, steps=5, image_shape=(2, 4, 4), cfg_scale=1.5)
    a, ya = sample(model, 4, generator=gen(7), return_labels=True, **kw)
    assert model.training
    b, yb = sample(model.eval(), 4, generator=gen(7), return_labels=True, **kw)
    assert not model.training
    c = sample(model, 4, generator=gen(8), **kw)
    assert torch.equal(a, b) and torch.equal(ya, yb) and not torch.equal(a, c)


def one_line_error(exc_type, match, fn, *args, **kw):
    with pytest.raises(exc_type, match=match) as info:
        fn(*args, **kw)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_bad_inputs_raise_one_line_errors(monkeypatch, tmp_path):
    uncond, cond = StandIn(make_cfg("ddpm-eps")), StandIn(make_cfg("interp-v", num_classes=3, class_dropout=0.1))
    kw = dict(image_shape=(2, 4, 4), generator=gen())
    msg = one_line_error(ConfigError, "unknown sampler 'dopri8'", sample, uncond, 2, sampler="dopri8", steps=2, **kw)
    assert all(name in msg for name in SAMPLERS)
    one_line_error(ConfigError, r"does not fit model.objective=ddpm-eps; use one of ddpm, ddim, dpm-solver\+\+",
                   sample, uncond, 2, sampler="euler", steps=2, **kw)
    one_line_error(ConfigError, "use one of euler, heun, euler-maruyama",
                   sample, cond, 2, sampler="ddim", steps=2, **kw)
    for steps in (0, -3, 2.5):
        one_line_error(ConfigError, "steps must be an integer >= 1", sample, cond, 2, sampler="euler", steps=steps, **kw)
    one_line_error(ConfigError, "at most 1000 steps", sample, uncond, 2, sampler="ddpm", steps=1001, **kw)
    for extra in ({"labels": [0, 1]}, {"cfg_scale": 2.0}):
        one_line_error(UserError, r"unconditional \(model.num_classes=0\); drop --guidance-scale/--labels",
                       sample, uncond, 2, sampler="ddim", steps=2, **extra, **kw)
    no_dropout = StandIn(make_cfg("interp-v", num_classes=3, class_dropout=0.0))
    one_line_error(UserError, r"guidance needs label dropout in training \(model.class_dropout>0\)",
                   sample, no_dropout, 2, sampler="euler", steps=2, cfg_scale=3.0, **kw)
    one_line_error(UserError, r"labels must lie in 0..2", sample, cond, 2, sampler="euler", steps=2, labels=[0, 3], **kw)
    one_line_error(UserError, "labels must be 2 integer", sample, cond, 2, sampler="euler", steps=2, labels=[0], **kw)
    one_line_error(UserError, r"dopri5 needed more than 2 steps at atol 1e-09, rtol 1e-08; raise --steps",
                   sample, Oracle("interp-v", s=0.5), 2, sampler="dopri5", steps=2, atol=1e-9, rtol=1e-8, **kw)
    for tol in (0.0, -1e-3, float("nan"), "1e-3"):
        one_line_error(ConfigError, "rtol \\(dopri5's error tolerance\\) must be a positive number",
                       sample, cond, 2, sampler="dopri5", steps=9, rtol=tol, **kw)
    one_line_error(UserError, "image_shape must be", sample, cond, 2, sampler="euler", steps=2, image_shape=(4, 4))
    one_line_error(UserError, "has no .cfg", sample, nn.Conv2d(2, 2, 1), 2, sampler="euler", steps=2, **kw)
    one_line_error(ConfigError, "model.objective 'x0' is unknown",
                   sample, StandIn(make_cfg("x0")), 2, sampler="euler", steps=2, **kw)
    one_line_error(ConfigError, "set model.noise_schedule=linear", objective_for, make_cfg("interp-v", "cosine"))
    one_line_error(ConfigError, "noise schedule 'quadratic' is unknown", DDPM, "quadratic")
    one_line_error(UserError, "has no labels", diffusion_loss, cond, torch.randn(2, 2, 4, 4), None)
    one_line_error(UserError, "uint8 images", save_npz, tmp_path / "x.npz", np.zeros((2, 4, 4, 3)))
    monkeypatch.setitem(sys.modules, "diffusers", None)
    one_line_error(UserError, "pip install diffusers", sample, uncond, 2, sampler="ddim", steps=2, **kw)
    monkeypatch.setitem(sys.modules, "torchdiffeq", None)
    one_line_error(UserError, "pip install torchdiffeq", sample, cond, 2, sampler="dopri5", steps=9, **kw)


def test_to_uint8_and_adm_npz(tmp_path):
    x = torch.tensor([-1.5, -1.0, 0.0, 1.0, 2.0]).view(1, 1, 1, 5).expand(2, 3, 1, 5)
    img = to_uint8(x)
    assert img.shape == (2, 1, 5, 3) and img.dtype == np.uint8
    assert img[0, 0, :, 0].tolist() == [0, 0, 128, 255, 255]
    path = save_npz(tmp_path / "out" / "samples", img, labels=[4, 5])
    assert path.name == "samples.npz"
    with np.load(path) as f:
        assert np.array_equal(f["arr_0"], img) and f["arr_1"].tolist() == [4, 5]
