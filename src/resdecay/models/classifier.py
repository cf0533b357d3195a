"""Image classifiers on a pretrained (decayed) MAE encoder, for MAE's two supervised protocols:

    fine-tuning   whole encoder trained, stochastic depth, layer-wise lr decay, mixup/cutmix,
                  label smoothing; head = LayerNorm + Linear on the mean of the patch tokens
    linear probe  encoder frozen; head = BatchNorm1d(affine=False) + Linear on the cls token,
                  trained with LARS on augmented views

The encoder is rebuilt from the pretraining config (alpha_min, schedule, depth, ... in
``encoder``), so its decayed shortcuts are exactly those it was pretrained with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import check_fields
from ..nn.blocks import init_linear_xavier, init_patch_embed, sincos_pos_embed_2d
from .contract import ModelConfig
from .encoder import ViTEncoder
from .mae import TINY_MAE, MAEConfig
from .registry import register_family

Head = Literal["ln_linear", "bn_linear"]
Pool = Literal["patch_mean", "cls", "mean"]


@dataclass
class ClassifierConfig(ModelConfig):
    family: str = "classifier"
    encoder: dict = field(default_factory=dict)  # the pretrained MAE's model config
    num_classes: int = 10
    head: Head = "ln_linear"  # ln_linear (fine-tuning) | bn_linear (MAE's linear probe)
    pool: Pool = "patch_mean"  # patch_mean (MAE fine-tuning's global pool) | cls | mean (all tokens)
    freeze_encoder: bool = False  # linear probing: only the head trains
    drop_path: float = 0.0  # stochastic depth rate of the last block (linear in depth); replaces the encoder's drops
    layer_decay: float = 1.0  # lr of block i scaled by layer_decay^(depth + 1 - (i + 1))
    mixup: float = 0.0  # mixup alpha (timm's Mixup); 0 = off
    cutmix: float = 0.0  # cutmix alpha; 0 = off
    label_smoothing: float = 0.0
    pretrained: str | None = None  # the MAE checkpoint the encoder started from
    grad_checkpointing: bool = False  # recompute block activations in the backward pass (memory; same gradients)

    # ModelConfig members (what the trainer and the data pipeline read from any model config),
    # answered from the pretrained encoder's config: the classifier has its input, decay and depth
    @property
    def img_size(self) -> int:
        return self.encoder_config().img_size

    @property
    def in_chans(self) -> int:
        return self.encoder_config().in_chans

    @property
    def alpha_min(self) -> float:
        return self.encoder_config().alpha_min

    @property
    def schedule(self) -> str:
        return self.encoder_config().schedule

    @property
    def depth(self) -> int:
        return self.encoder_config().depth

    def encoder_config(self) -> MAEConfig:
        return MAEConfig(**self.encoder)

    @property
    def token_grid(self) -> tuple[int, int]:
        return self.encoder_config().token_grid

    def validate(self) -> None:
        if not self.encoder:
            raise ValueError("model.encoder is empty: build classifiers with `resdecay finetune CHECKPOINT`")
        self.encoder_config().validate()
        check_fields(self, "model")
        if self.num_classes < 2:
            raise ValueError(f"model.num_classes must be >= 2, got {self.num_classes}")
        if not 0 < self.layer_decay <= 1 or not 0 <= self.drop_path < 1:
            raise ValueError("model.layer_decay must lie in (0, 1] and model.drop_path in [0, 1)")
        if min(self.mixup, self.cutmix, self.label_smoothing) < 0:
            raise ValueError("model.mixup, model.cutmix and model.label_smoothing must be >= 0")


def classifier_objective(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return model(images, labels)[0]


def classifier_param_groups(model: EncoderClassifier, weight_decay: float) -> list[dict]:
    """MAE's fine-tuning groups: layer-wise lr decay (patch embedding, cls and positions are layer
    0, block i is layer i+1, the head is layer depth+1 with scale 1) and no weight decay on biases,
    1-D parameters and the cls token."""
    depth, decay = len(model.blocks), model.head_cfg.layer_decay
    groups: dict[tuple, dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.startswith(("cls_token", "pos_embed", "patch_embed")):
            layer = 0
        elif name.startswith("blocks."):
            layer = int(name.split(".")[1]) + 1
        else:
            layer = depth + 1
        no_wd = p.ndim <= 1 or name.endswith(".bias") or name == "cls_token"
        g = groups.setdefault((layer, no_wd), {"params": [], "weight_decay": 0.0 if no_wd else weight_decay,
                                               "lr_scale": decay ** (depth + 1 - layer)})
        g["params"].append(p)
    return list(groups.values())


@register_family("classifier", config=ClassifierConfig, objective=classifier_objective, param_groups=classifier_param_groups,
                 tiny=dict(encoder=TINY_MAE, num_classes=10))
class EncoderClassifier(ViTEncoder):
    def __init__(self, cfg: ClassifierConfig):
        cfg.validate()
        enc = cfg.encoder_config()
        super().__init__(enc, drop_path=cfg.drop_path, tokens=1 + (enc.img_size // enc.patch_size) ** 2)  # all tokens
        self.head_cfg = cfg
        D = self.cfg.embed_dim
        self.fc_norm = nn.LayerNorm(D, eps=1e-6) if cfg.head == "ln_linear" else nn.BatchNorm1d(D, affine=False, eps=1e-6)
        self.head = nn.Linear(D, cfg.num_classes)
        self.mixup = None
        if cfg.mixup > 0 or cfg.cutmix > 0:
            from timm.data import Mixup

            self.mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.label_smoothing,
                               num_classes=cfg.num_classes)
        self.initialize_weights()
        if cfg.freeze_encoder:
            for name, p in self.named_parameters():
                if not name.startswith(("fc_norm", "head")):
                    p.requires_grad_(False)

    def initialize_weights(self) -> None:
        # 1. A fresh encoder as the MAE would start (replaced by the pretrained weights on a new run).
        self.pos_embed.data.copy_(sincos_pos_embed_2d(self.cfg.embed_dim, self.patch_embed.grid).unsqueeze(0))
        self.apply(init_linear_xavier)
        init_patch_embed(self.patch_embed)
        nn.init.normal_(self.cls_token, std=0.02)
        # 2. The head starts near zero (MAE: std 2e-5 for fine-tuning, 0.01 for the probe), so the
        #    first steps do not push large random gradients into the pretrained encoder.
        nn.init.trunc_normal_(self.head.weight, std=2e-5 if self.head_cfg.head == "ln_linear" else 0.01)
        nn.init.zeros_(self.head.bias)

    @property
    def decoder_blocks(self) -> nn.ModuleList:
        """A classifier has no decoder (the model contract's empty list)."""
        return nn.ModuleList()

    def train(self, mode: bool = True):
        super().train(mode)
        if self.head_cfg.freeze_encoder:  # a frozen encoder always runs as at test time
            for name, module in self.named_children():
                if name not in ("fc_norm", "head"):
                    module.eval()
        return self

    def forward(self, imgs: torch.Tensor, labels: torch.Tensor | None = None):
        """Logits (B, num_classes); with labels, ``(loss, logits)`` (mixup applied when training)."""
        targets = labels
        if labels is not None and self.training and self.mixup is not None:
            imgs, targets = self.mixup(imgs, labels)  # soft targets
        tokens = self.forward_features(imgs)  # (B, 1+N, D), raw last block
        feats = {"patch_mean": lambda t: t[:, 1:].mean(1), "cls": lambda t: t[:, 0], "mean": lambda t: t.mean(1)}[self.head_cfg.pool](tokens)
        logits = self.head(self.fc_norm(feats))
        if labels is None:
            return logits
        if targets.ndim == 2:
            loss = torch.sum(-targets * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
        else:
            loss = F.cross_entropy(logits.float(), targets, label_smoothing=self.head_cfg.label_smoothing if self.training else 0.0)
        return loss, logits

    def flops_per_sample(self) -> float:
        n = self.patch_embed.num_patches
        f = 2 * n * self.cfg.in_chans * self.cfg.patch_size**2 * self.cfg.embed_dim + self.encoder_flops(n + 1)
        return float(f if not self.head_cfg.freeze_encoder else f / 3)  # frozen: no backward through the encoder
