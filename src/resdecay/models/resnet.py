"""Supervised ResNets with decayed shortcuts (paper appendix B.2, Figure 7).

torchvision's ResNet built for small images (3x3 stem, no max-pool, as for CIFAR) and passed
through ``decayify``: the identity path of block l (and its downsample path) is scaled by the
linear schedule over all blocks. Figure 7 deepens the network by repeating the blocks of
stage 3: ``layers=[2, 2, N, 2]`` with N from 2 (ResNet-18) to 16.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError, check_fields
from ..nn.decayify import alphas_of, decayify
from ..nn.residual import check_shortcut
from ..schedule import Branches, Schedule, check_alpha_min
from .common import resolve_blocks
from .contract import ModelConfig
from .registry import register_family


@dataclass
class ResNetConfig(ModelConfig):
    family: str = "resnet"
    img_size: int = 32
    in_chans: int = 3
    num_classes: int = 10
    block: Literal["basic", "bottleneck"] = "basic"  # basic (ResNet-18/34) | bottleneck (ResNet-50 style)
    layers: list[int] = field(default_factory=lambda: [2, 2, 2, 2])  # blocks per stage
    width: int = 64  # channels of the first stage (x2 per stage)
    small_input: bool = True  # CIFAR stem: 3x3 conv, stride 1, no max-pool
    alpha_min: float = 1.0
    schedule: Schedule = "linear"
    shortcut: str = "decay"  # a registered formula with fixed factors: decay | scaled_sum | scaled_branch (not learnable)
    decay_branches: Branches = "both"  # one residual add per block: only "both"
    zero_init: bool = False  # zero the last BatchNorm scale of every block
    label_smoothing: float = 0.0

    def validate(self) -> None:
        check_fields(self, "model", positive=("width",))
        check_alpha_min(self.alpha_min)
        check_shortcut(self.shortcut, self.decay_branches, adds_per_block=1, fixed_by="a ResNet (decayify's hooks)",
                       feature_maps=True)
        if len(self.layers) != 4 or min(self.layers) < 1:
            raise ConfigError("model.layers must be four positive block counts, e.g. [2, 2, 2, 2]")
        if self.num_classes < 2:
            raise ConfigError(f"model.num_classes must be >= 2, got {self.num_classes}")

    @property
    def depth(self) -> int:
        return sum(self.layers)


class SupervisedResNet(nn.Module):
    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        # torchvision is imported here, not with the module: models/ imports every family at start-up,
        # and importing torchvision costs about 2 s (its ops load torch._dynamo)
        from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

        block = BasicBlock if cfg.block == "basic" else Bottleneck
        net = ResNet(block, cfg.layers, num_classes=cfg.num_classes, width_per_group=64)
        if cfg.width != 64:  # torchvision fixes 64 channels for stage 1; rebuild with the asked width
            net = _narrow_resnet(block, cfg)
        if cfg.small_input:
            net.conv1 = nn.Conv2d(cfg.in_chans, net.conv1.out_channels, 3, 1, 1, bias=False)
            net.maxpool = nn.Identity()
        elif cfg.in_chans != 3:
            net.conv1 = nn.Conv2d(cfg.in_chans, net.conv1.out_channels, 7, 2, 3, bias=False)
        self.net = decayify(net, cfg.alpha_min, cfg.schedule, zero_init=cfg.zero_init, branches=cfg.decay_branches,
                            shortcut=cfg.shortcut)
        self.alphas = torch.tensor([a for _, a in alphas_of(self.net)], dtype=torch.float64)  # (blocks, 1)
        self._flops = None

    @property
    def blocks(self) -> nn.ModuleList:
        """The residual blocks of the four stages in network order (a view: they stay registered
        under ``net.layerN``, so the state_dict keys are torchvision's)."""
        return nn.ModuleList(b for stage in (self.net.layer1, self.net.layer2, self.net.layer3, self.net.layer4) for b in stage)

    @property
    def decoder_blocks(self) -> nn.ModuleList:
        """A ResNet has no decoder (the model contract's empty list)."""
        return nn.ModuleList()

    @property
    def num_blocks(self) -> int:
        return sum(self.cfg.layers)

    def forward(self, imgs: torch.Tensor, labels: torch.Tensor | None = None):
        logits = self.net(imgs)
        if labels is None:
            return logits
        return F.cross_entropy(logits.float(), labels, label_smoothing=self.cfg.label_smoothing if self.training else 0.0), logits

    def forward_intermediates(self, imgs: torch.Tensor, indices: list[int] | None = None) -> list[torch.Tensor]:
        """Global-average-pooled outputs of the requested residual blocks, as (B, 1, C) "tokens"
        so the evaluation suite treats them like a transformer's (the last one is the feature
        the classifier sees)."""
        blocks = self.blocks
        depth = len(blocks)
        wanted = resolve_blocks(indices, depth)
        n = self.net
        x = n.maxpool(n.relu(n.bn1(n.conv1(imgs))))
        out = {}
        for i, blk in enumerate(blocks[: max(wanted) + 1]):
            x = blk(x)
            if i in wanted:
                out[i] = x.mean((2, 3)).unsqueeze(1)
        return [out[i] for i in wanted]

    def forward_features(self, imgs: torch.Tensor) -> torch.Tensor:
        """The last block's globally pooled output as one (B, 1, C) token: what evaluation pools."""
        return self.forward_intermediates(imgs)[0]

    def flops_per_sample(self) -> float:
        """Forward multiply-add FLOPs of one image, counted once with hooks on convs and linears."""
        if self._flops is None:
            total = [0.0]

            def count(m, args, out):
                if isinstance(m, nn.Conv2d):
                    total[0] += 2 * out.numel() * m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
                elif isinstance(m, nn.Linear):
                    total[0] += 2 * m.in_features * m.out_features

            hooks = [m.register_forward_hook(count) for m in self.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
            was = self.training
            self.eval()
            p = next(self.parameters())
            with torch.no_grad():
                self.net(torch.zeros(1, self.cfg.in_chans, self.cfg.img_size, self.cfg.img_size, device=p.device, dtype=p.dtype))
            self.train(was)
            for h in hooks:
                h.remove()
            self._flops = total[0]
        return self._flops


def _narrow_resnet(block, cfg: ResNetConfig) -> nn.Module:
    """A torchvision ResNet whose stages have width, 2*width, 4*width, 8*width channels."""
    from torchvision.models.resnet import ResNet

    net = ResNet(block, cfg.layers, num_classes=cfg.num_classes)
    net.inplanes = cfg.width
    net.conv1 = nn.Conv2d(3, cfg.width, 7, 2, 3, bias=False)
    net.bn1 = nn.BatchNorm2d(cfg.width)
    net.layer1 = net._make_layer(block, cfg.width, cfg.layers[0])
    net.layer2 = net._make_layer(block, cfg.width * 2, cfg.layers[1], stride=2)
    net.layer3 = net._make_layer(block, cfg.width * 4, cfg.layers[2], stride=2)
    net.layer4 = net._make_layer(block, cfg.width * 8, cfg.layers[3], stride=2)
    net.fc = nn.Linear(cfg.width * 8 * block.expansion, cfg.num_classes)
    for m in net.modules():  # torchvision's initialisation for the rebuilt layers
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)
    return net


def resnet_objective(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return model(images, labels)[0]


register_family("resnet", build=SupervisedResNet, config=ResNetConfig, objective=resnet_objective,
                tiny=dict(img_size=16, width=8, layers=[1, 1, 1, 1], alpha_min=0.7))
