"""Every shipped preset against the recipe it cites (issue 23.9).

Each preset has a row in ``RECIPES``: the values of the recipe it names, each with its source (paper-notes
§3, the paper's appendix, or the official script: file and value), the words its comment must contain
(what it cites, the GPUs behind its per-device batch, and any difference it declares), and, for a shrunk
CPU preset, which keys it may change. The test is parametrised over ``src/resdecay/presets/*.yaml``, so a
new preset without a row fails; so does a preset key that no row covers, a value that drifts from its
recipe, and a difference the comment does not declare.

Official scripts read (commit of the stored copy): facebookresearch/mae efb2a80 (main_pretrain.py,
main_finetune.py, main_linprobe.py, PRETRAIN.md, FINETUNE.md, models_mae.py), willisma/SiT (train.py,
models.py, train_utils.py), baofff/U-ViT (configs/cifar10_uvit_small.py, configs/imagenet64_uvit_mid.py,
configs/imagenet256_uvit_large.py, train.py, sde.py, libs/uvit.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import pytest

from resdecay.data import DataConfig
from resdecay.models import model_config_class
from resdecay.train.config import TrainConfig, _read_preset, list_presets, preset_text

MAE = "facebookresearch/mae"
OPERATIONAL = {"train.ckpt_every", "train.log_every", "train.keep_last", "data.num_workers", "data.path"}
# What a shrunk CPU preset may change without a word: model sizes, the data set, and the budget.
SIZE = {"model.img_size", "model.in_chans", "model.patch_size", "model.embed_dim", "model.depth", "model.num_heads",
        "model.decoder_embed_dim", "model.decoder_depth", "model.decoder_num_heads", "model.num_classes",
        "data.name", "data.canvas", "data.nuisances", "data.normalize",
        "train.epochs", "train.warmup_epochs", "train.batch_size"}


@dataclass
class Recipe:
    values: dict  # key -> (value, source)
    cites: tuple = ()  # words the preset's comment must contain
    gpus: int | None = None  # devices behind the per-device batch: batch_size x gpus = the recipe's batch
    batch: int | None = None
    steps: dict = field(default_factory=dict)  # key -> (the recipe's steps, steps per epoch at its batch)
    free: frozenset = frozenset()  # keys this preset may set to anything (a shrunk preset's sizes and tuned keys)


def derive(parent: Recipe, values: dict | None = None, cites: tuple = (), free: set = frozenset(),
           keep_batch: bool = True) -> Recipe:
    """``parent`` with some values replaced (a -plain baseline, a smaller size) or freed (a shrunk preset)."""
    kept = {k: v for k, v in parent.values.items() if k not in free}
    return replace(parent, values={**kept, **(values or {})}, cites=cites, free=frozenset(free) | parent.free,
                   gpus=parent.gpus if keep_batch else None, batch=parent.batch if keep_batch else None,
                   steps=parent.steps if keep_batch else {})


def shrink(parent: Recipe, name: str, tuned: dict, extra_size: set = frozenset()) -> Recipe:
    """A CPU-sized preset: it names ``name`` ("Shrinks <name>"), changes sizes freely, and names each other
    key it changes (``tuned``: key -> the word its comment must contain)."""
    return derive(parent, cites=(f"Shrinks {name}", *tuned.values()), free=SIZE | set(tuned) | set(extra_size),
                  keep_batch=False)


PRETRAIN = f"{MAE} main_pretrain.py"
MAE_B16 = Recipe(values={
    "model.family": ("mae", "paper A.1: an MAE"),
    "model.img_size": (224, f"{PRETRAIN} --input_size 224"),
    "model.in_chans": (3, "ImageNet RGB"),
    "model.patch_size": (16, f"{MAE} models_mae.py mae_vit_base_patch16_dec512d8b"),
    "model.embed_dim": (768, "models_mae.py ViT-B: embed_dim 768"),
    "model.depth": (12, "models_mae.py ViT-B: depth 12"),
    "model.num_heads": (12, "models_mae.py ViT-B: num_heads 12"),
    "model.mlp_ratio": (4.0, "models_mae.py mlp_ratio 4"),
    "model.decoder_embed_dim": (512, "models_mae.py dec512d8b; paper-notes §2"),
    "model.decoder_depth": (8, "models_mae.py dec512d8b"),
    "model.decoder_num_heads": (16, "models_mae.py decoder_num_heads 16"),
    "model.alpha_min": (0.6, "paper Table 1 (ours, alpha_min 0.6); paper-notes §3"),
    "model.schedule": ("linear", "paper-notes §1: the authors' code, linspace(1, alpha_min, 2L)"),
    "model.shortcut": ("decay", "paper-notes §1"),
    "model.decay_branches": ("both", "paper Table 3b: both sub-blocks (83.6)"),
    "model.decoder_decay": (False, "paper-notes §1: decay in the MAE encoder only"),
    "model.skips": (True, "paper-notes §2: encoder->decoder long skips"),
    "model.skip_sources": (None, "paper-notes §2: every other block, ending with the last"),
    "model.zero_init": (True, "paper-notes §1-2: zero-init of each branch's last layer"),
    "model.encoder_norm": (False, "paper-notes §2: no final encoder norm"),
    "model.mask_ratio": (0.75, f"{PRETRAIN} --mask_ratio 0.75; paper A.1"),
    "model.norm_pix_loss": (True, f"{MAE} PRETRAIN.md --norm_pix_loss; paper A.1"),
    "data.name": ("imagefolder", "ImageNet layout"),
    "data.augment": ("mae", f"{PRETRAIN} RandomResizedCrop(scale=(0.2, 1.0), interpolation=3) + flip"),
    "data.normalize": ("dataset", f"{PRETRAIN} Normalize(ImageNet mean, std)"),
    "train.epochs": (800, "paper A.1: 800 epochs; PRETRAIN.md --epochs 800"),
    "train.warmup_epochs": (40, "paper A.1; PRETRAIN.md --warmup_epochs 40"),
    "train.batch_size": (128, "paper A.1: batch 1024 = 8 GPUs x 128"),
    "train.accum_steps": (1, "paper A.1: batch 1024 = 8 GPUs x 128"),
    "train.base_lr": (1.5e-4, "PRETRAIN.md --blr 1.5e-4 (paper A.1: lr 6e-4 at batch 1024)"),
    "train.lr": (None, "the base_lr rule"),
    "train.min_lr": (0.0, f"{PRETRAIN} --min_lr 0; paper A.1: cosine to zero"),
    "train.lr_schedule": ("cosine", f"{MAE} util/lr_sched.py half-cycle cosine"),
    "train.weight_decay": (0.05, "PRETRAIN.md --weight_decay 0.05"),
    "train.beta1": (0.9, f"{PRETRAIN} AdamW betas=(0.9, 0.95)"),
    "train.beta2": (0.95, f"{PRETRAIN} AdamW betas=(0.9, 0.95)"),
    "train.optimizer": ("adamw", f"{PRETRAIN} torch.optim.AdamW"),
    "train.grad_clip": (None, f"{MAE} engine_pretrain.py: no clipping"),
    "train.ema_decay": (0.0, "MAE keeps no EMA"),
}, cites=("8 GPUs x 128",), gpus=8, batch=1024)
PLAIN_MAE = {  # the standard MAE of models_mae.py: plain residuals, no skips, xavier init, encoder LayerNorm
    "model.alpha_min": (1.0, f"{MAE} models_mae.py: x + f(x)"),
    "model.skips": (False, "models_mae.py: the decoder sees the encoder output only"),
    "model.zero_init": (False, "models_mae.py: xavier_uniform Linears"),
    "model.encoder_norm": (True, "models_mae.py: self.norm after the encoder blocks"),
}
MAE_TINY = {"train.base_lr": "base_lr", "data.augment": "augment"}

FINETUNE = f"{MAE} main_finetune.py"
FINETUNE_MAE = Recipe(values={
    "model.family": ("classifier", "a classifier on the pretrained encoder"),
    "model.head": ("ln_linear", f"{FINETUNE} --global_pool: fc_norm LayerNorm + head"),
    "model.pool": ("patch_mean", f"{MAE} models_vit.py global_pool: x[:, 1:].mean(1)"),
    "model.freeze_encoder": (False, "fine-tuning trains every weight"),
    "model.drop_path": (0.1, f"{MAE} FINETUNE.md ViT-B --drop_path 0.1"),
    "model.layer_decay": (0.65, "FINETUNE.md ViT-B --layer_decay 0.65"),
    "model.mixup": (0.8, "FINETUNE.md --mixup 0.8"),
    "model.cutmix": (1.0, "FINETUNE.md --cutmix 1.0"),
    "model.label_smoothing": (0.1, f"{FINETUNE} --smoothing 0.1"),
    "data.augment": ("randaug", f"{FINETUNE} --aa rand-m9-mstd0.5-inc1, --reprob 0.25"),
    "train.epochs": (100, "FINETUNE.md ViT-B --epochs 100"),
    "train.warmup_epochs": (5, f"{FINETUNE} --warmup_epochs 5"),
    "train.batch_size": (128, "FINETUNE.md: effective batch 1024 (32 x 4 nodes x 8 GPUs)"),
    "train.base_lr": (5e-4, "FINETUNE.md ViT-B --blr 5e-4"),
    "train.min_lr": (1e-6, f"{FINETUNE} --min_lr 1e-6"),
    "train.lr_schedule": ("cosine", f"{MAE} util/lr_sched.py"),
    "train.weight_decay": (0.05, "FINETUNE.md --weight_decay 0.05"),
    "train.beta1": (0.9, f"{FINETUNE} torch.optim.AdamW(param_groups, lr): default betas"),
    "train.beta2": (0.999, f"{FINETUNE} torch.optim.AdamW default betas"),
    "train.optimizer": ("adamw", f"{FINETUNE} torch.optim.AdamW"),
    "train.grad_clip": (None, f"{FINETUNE} --clip_grad None"),
    "train.online_eval_every": (1, f"{FINETUNE}: evaluate(data_loader_val) after every epoch"),
}, cites=("FINETUNE.md", "main_finetune.py", "8 GPUs x 128"), gpus=8, batch=1024)

LINPROBE = f"{MAE} main_linprobe.py"
LINPROBE_MAE = Recipe(values={
    "model.family": ("classifier", "a classifier on the pretrained encoder"),
    "model.head": ("bn_linear", f"{LINPROBE} BatchNorm1d(affine=False) + head"),
    "model.pool": ("cls", f"{MAE} FINETUNE.md linear probing --cls_token"),
    "model.freeze_encoder": (True, f"{LINPROBE} requires_grad False except the head"),
    "model.drop_path": (0.0, f"{LINPROBE}: models_vit built without drop_path_rate"),
    "model.layer_decay": (1.0, f"{LINPROBE}: LARS on the head only"),
    "model.mixup": (0.0, f"{LINPROBE}: no mixup"),
    "model.cutmix": (0.0, f"{LINPROBE}: no cutmix"),
    "model.label_smoothing": (0.0, f"{LINPROBE} CrossEntropyLoss()"),
    "data.augment": ("rrc", f"{LINPROBE} RandomResizedCrop(224, interpolation=3): scale (0.08, 1) + flip"),
    "train.epochs": (90, "FINETUNE.md --epochs 90"),
    "train.warmup_epochs": (10, f"{LINPROBE} --warmup_epochs 10"),
    "train.batch_size": (2048, "FINETUNE.md: effective batch 16384 (512 x 4 nodes x 8 GPUs)"),
    "train.base_lr": (0.1, "FINETUNE.md --blr 0.1"),
    "train.min_lr": (0.0, f"{LINPROBE} --min_lr 0"),
    "train.lr_schedule": ("cosine", f"{MAE} util/lr_sched.py"),
    "train.weight_decay": (0.0, "FINETUNE.md --weight_decay 0.0"),
    "train.optimizer": ("lars", f"{LINPROBE} LARS(model.head.parameters())"),
    "train.online_eval_every": (1, f"{LINPROBE}: evaluate(data_loader_val) after every epoch"),
}, cites=("main_linprobe.py", "0.08-1", "8 GPUs x 2048"), gpus=8, batch=16384)

NO_SCRIPT = "the paper states no recipe (appendix B.2); the preset's own comment"
RESNET_CIFAR10 = Recipe(values={
    "model.family": ("resnet", "appendix B.2: ResNet-18"),
    "model.block": ("basic", "ResNet-18: basic blocks"),
    "model.layers": ([2, 2, 2, 2], "appendix B.2: 8 residual blocks equally in 4 layers"),
    "model.width": (64, "ResNet-18: 64 channels in the first stage"),
    "model.small_input": (True, "CIFAR stem (3x3 conv, no max-pool)"),
    "model.alpha_min": (1.0, "appendix B.2 baseline (alpha_min=0.7 by override: 94.4 vs 93.6)"),
    "model.schedule": ("linear", "paper-notes §1"),
    "model.zero_init": (False, NO_SCRIPT),
    "model.img_size": (32, "CIFAR"),
    "model.in_chans": (3, "CIFAR"),
    "model.num_classes": (10, "CIFAR-10"),
    "data.name": ("cifar10", "appendix B.2: 94.4 / 93.6 test accuracy"),
    "data.augment": ("cifar", f"{NO_SCRIPT}: pad-4 crop + flip"),
    "train.epochs": (200, NO_SCRIPT), "train.warmup_epochs": (1, NO_SCRIPT), "train.batch_size": (128, NO_SCRIPT),
    "train.lr": (0.1, NO_SCRIPT), "train.weight_decay": (5e-4, NO_SCRIPT),
    "train.optimizer": ("sgd", f"{NO_SCRIPT}: SGD, Nesterov momentum 0.9 (train/optim.py)"),
    "train.lr_schedule": ("cosine", NO_SCRIPT), "train.min_lr": (0.0, NO_SCRIPT),
}, cites=("Nesterov momentum 0.9", "lr 0.1", "batch 128", "weight decay 5e-4", "200 epochs"))

SIT = "willisma/SiT"
SIT_XL2 = Recipe(values={
    "model.family": ("sit", "paper-notes §3: SiT-XL/2"),
    "model.img_size": (32, f"{SIT} train.py latent_size = image_size // 8 (256 -> 32)"),
    "model.in_chans": (4, f"{SIT} train.py: 4-channel VAE latents"),
    "model.patch_size": (2, f"{SIT} models.py SiT_XL_2: patch_size 2"),
    "model.embed_dim": (1152, "models.py SiT_XL_2: hidden_size 1152"),
    "model.depth": (28, "models.py SiT_XL_2: depth 28"),
    "model.num_heads": (16, "models.py SiT_XL_2: num_heads 16"),
    "model.mlp_ratio": (4.0, "models.py SiT: mlp_ratio 4.0"),
    "model.qkv_bias": (True, "models.py SiTBlock Attention(qkv_bias=True)"),
    "model.gelu": ("tanh", "models.py approx_gelu GELU(approximate='tanh')"),
    "model.num_classes": (1000, f"{SIT} train.py --num-classes 1000"),
    "model.class_dropout": (0.1, "models.py class_dropout_prob=0.1"),
    "model.alpha_min": (0.8, "paper: SiT-XL/2 alpha_min 0.8 (FID 11.8); paper-notes §3"),
    "model.schedule": ("linear", "paper-notes §1"),
    "model.skips": (True, "paper-notes §3: mirrored-half Linear skips"),
    "model.zero_init": (False, "paper-notes (later evidence): the authors' skip Linears are xavier"),
    "model.objective": ("interp-v", f"{SIT} train_utils.py --path-type Linear --prediction velocity"),
    "model.noise_schedule": ("linear", "the linear path"),
    "data.name": ("latents", "SiT trains on SD-VAE latents"),
    "data.augment": ("none", "latents are cached (the declared difference: SiT flips before encoding)"),
    "train.epochs": (80, "paper: 400k steps; ImageNet-1K at batch 256"),
    "train.warmup_epochs": (0, f"{SIT} train.py: no warmup"),
    "train.batch_size": (32, f"{SIT} train.py --global-batch-size 256 = 8 GPUs x 32"),
    "train.lr": (1e-4, f"{SIT} train.py AdamW(lr=1e-4, weight_decay=0)"),
    "train.lr_schedule": ("constant", f"{SIT} train.py: no scheduler"),
    "train.weight_decay": (0.0, f"{SIT} train.py AdamW(weight_decay=0)"),
    "train.beta1": (0.9, f"{SIT} train.py AdamW default betas"),
    "train.beta2": (0.999, f"{SIT} train.py AdamW default betas"),
    "train.ema_decay": (0.9999, f"{SIT} train.py update_ema(decay=0.9999)"),
    "train.ema_warmup": (False, f"{SIT} train.py: EMA from step 0 at 0.9999"),
    "train.grad_clip": (None, f"{SIT} train.py: no clipping"),
}, cites=("willisma/SiT", "8 GPUs x 32", "posterior mean", "randomly flipped"), gpus=8, batch=256,
    steps={"train.epochs": (400_000, 1_281_167 / 256)})
PLAIN_DIFFUSION = {"model.alpha_min": (1.0, "plain residuals"), "model.skips": (False, "no long skips")}

UVIT = "baofff/U-ViT"
UVIT_CIFAR = f"{UVIT} configs/cifar10_uvit_small.py"
UVIT_S2 = Recipe(values={
    "model.family": ("uvit", "paper Table 4: U-ViT-small on CIFAR-100"),
    "model.img_size": (32, f"{UVIT_CIFAR} img_size 32"),
    "model.in_chans": (3, "CIFAR pixels"),
    "model.patch_size": (2, f"{UVIT_CIFAR} patch_size 2"),
    "model.embed_dim": (512, f"{UVIT_CIFAR} embed_dim 512"),
    "model.depth": (13, f"{UVIT_CIFAR} depth 12: {UVIT} libs/uvit.py 6 in + mid + 6 out blocks"),
    "model.num_heads": (8, f"{UVIT_CIFAR} num_heads 8"),
    "model.mlp_ratio": (4.0, f"{UVIT_CIFAR} mlp_ratio 4"),
    "model.qkv_bias": (False, f"{UVIT_CIFAR} qkv_bias False"),
    "model.num_classes": (0, f"{UVIT_CIFAR} num_classes -1 (mode uncond); paper: unconditional"),
    "model.alpha_min": (0.7, "paper Table 4: CIFAR-100 best FID 8.99 at alpha_min 0.7"),
    "model.schedule": ("linear", "paper-notes §1"),
    "model.skips": (True, "U-ViT's long skips"),
    "model.zero_init": (True, "paper-notes §1: zero-init, needed for alpha_min <= 0.7"),
    "model.objective": ("ddpm-eps", f"{UVIT_CIFAR} pred noise_pred"),
    "model.noise_schedule": ("linear", f"{UVIT} sde.py VPSDE(beta_min 0.1, beta_max 20) = 1000 x (1e-4 .. 0.02)"),
    "data.name": ("cifar100", "paper Table 4: CIFAR-100"),
    "data.normalize": ("symmetric", f"{UVIT} datasets.py Normalize(0.5, 0.5)"),
    "data.augment": ("flip", f"{UVIT_CIFAR} random_flip True"),
    "train.epochs": (1280, f"{UVIT_CIFAR} n_steps 500000 at 390 steps per epoch"),
    "train.warmup_epochs": (6.4, f"{UVIT_CIFAR} warmup_steps 2500"),
    "train.batch_size": (128, f"{UVIT_CIFAR} batch_size 128"),
    "train.lr": (2e-4, f"{UVIT_CIFAR} lr 0.0002"),
    "train.lr_schedule": ("constant", f"{UVIT} utils.py customized: min(step / warmup, 1)"),
    "train.weight_decay": (0.03, f"{UVIT_CIFAR} weight_decay 0.03"),
    "train.beta1": (0.99, f"{UVIT_CIFAR} betas (0.99, 0.999)"),
    "train.beta2": (0.999, f"{UVIT_CIFAR} betas (0.99, 0.999)"),
    "train.ema_decay": (0.9999, f"{UVIT} train.py ema_rate 0.9999"),
    "train.ema_warmup": (False, f"{UVIT} train.py: EMA at 0.9999 from the start"),
    "train.grad_clip": (None, f"{UVIT_CIFAR}: no grad_clip"),
}, cites=("cifar10_uvit_small.py", "VP-SDE", "Euler-Maruyama", "--sampler ddpm --steps 1000", "dpm-solver++"),
    gpus=1, batch=128, steps={"train.epochs": (500_000, 50_000 // 128), "train.warmup_epochs": (2500, 50_000 // 128)})

UVIT_LATENT = f"{UVIT} configs/imagenet256_uvit_large.py"
UVIT_MID = f"{UVIT} configs/imagenet64_uvit_mid.py"
UVIT_M2 = Recipe(values={
    **{k: v for k, v in UVIT_S2.values.items() if k.startswith("model.") and k not in ("model.num_classes", "model.alpha_min")},
    "model.in_chans": (4, f"{UVIT_LATENT} z_shape (4, 32, 32)"),
    "model.embed_dim": (768, f"{UVIT_MID} embed_dim 768"),
    "model.depth": (17, f"{UVIT_MID} depth 16: 8 in + mid + 8 out blocks"),
    "model.num_heads": (12, f"{UVIT_MID} num_heads 12"),
    "model.num_classes": (100, "paper Table 4: ImageNet-100 class-conditional row"),
    "model.class_dropout": (0.15, f"{UVIT_LATENT} p_uncond 0.15"),
    "model.alpha_min": (0.7, "paper Table 4: ImageNet-100 unconditional best LP 76.1 at 0.7"),
    "data.name": ("latents", "paper: latent diffusion, 256x256x3 -> 32x32x4"),
    "train.batch_size": (256, f"{UVIT_LATENT} batch_size 1024 = 4 GPUs x 256"),
    "train.lr": (2e-4, f"{UVIT_LATENT} lr 0.0002"),
    "train.lr_schedule": ("constant", f"{UVIT} utils.py customized"),
    "train.weight_decay": (0.03, f"{UVIT_LATENT} weight_decay 0.03"),
    "train.beta1": (0.99, f"{UVIT_LATENT} betas (0.99, 0.99)"),
    "train.beta2": (0.99, f"{UVIT_LATENT} betas (0.99, 0.99)"),
    "train.ema_decay": (0.9999, f"{UVIT} train_ldm.py ema_rate 0.9999"),
    # declared differences: the comment names U-ViT's values
    "train.warmup_epochs": (5, f"declared: {UVIT_LATENT} warmup_steps 5000"),
    "train.epochs": (800, f"declared: {UVIT_LATENT} n_steps 300000"),
}, cites=("imagenet64_uvit_mid.py", "imagenet256_uvit_large.py", "4 GPUs x 256", "5,000 steps", "300k", "VP-SDE",
          "scaled-linear", "DPM-Solver"), gpus=4, batch=1024)

RECIPES: dict[str, Recipe] = {
    "mae-b16": MAE_B16,
    "mae-s16": derive(MAE_B16, {"model.embed_dim": (384, "paper Table 2 row 384x12 (ViT-S)"),
                                "model.num_heads": (6, "ViT-S/16: 6 heads"),
                                "model.alpha_min": (0.6, "paper Table 2 row 384x12: best 78.5 at 0.6")},
                      cites=("Table 2 row 384x12", "8 GPUs x 128")),
    "mae-l16": derive(MAE_B16, {"model.embed_dim": (1024, f"{MAE} models_mae.py mae_vit_large_patch16"),
                                "model.depth": (24, "models_mae.py ViT-L: depth 24"),
                                "model.num_heads": (16, "models_mae.py ViT-L: 16 heads"),
                                "model.alpha_min": (0.7, "paper Table 2 row 1024x24: best 86.0 at 0.7")},
                      cites=("Table 2 row 1024x24", "8 GPUs x 128")),
    "finetune-mae": FINETUNE_MAE,
    "linprobe-mae": LINPROBE_MAE,
    "mae-tiny-digits": shrink(MAE_B16, "mae-b16", MAE_TINY),
    "mae-tiny-fmnist": shrink(MAE_B16, "mae-b16", MAE_TINY),
    "mae-tiny-fmnistm": shrink(MAE_B16, "mae-b16", MAE_TINY),
    "resnet18-cifar10": RESNET_CIFAR10,
    "resnet18-cifar100": derive(RESNET_CIFAR10, {"model.num_classes": (100, "CIFAR-100"),
                                                 "data.name": ("cifar100", "CIFAR-100")}, cites=RESNET_CIFAR10.cites),
    "resnet18-fmnist": derive(RESNET_CIFAR10, cites=("Adapts resnet18-cifar10", "flip"),
                              free={"model.img_size", "model.in_chans", "data.name", "data.augment"}),
    "sit-xl2": SIT_XL2,
    "sit-b2": derive(SIT_XL2, {"model.embed_dim": (768, f"{SIT} models.py SiT_B_2"), "model.depth": (12, "SiT_B_2"),
                               "model.num_heads": (12, "SiT_B_2")}, cites=("SiT-B/2", "SiT-XL/2 recipe")),
    "sit-s2": derive(SIT_XL2, {"model.embed_dim": (384, f"{SIT} models.py SiT_S_2"), "model.depth": (12, "SiT_S_2"),
                               "model.num_heads": (6, "SiT_S_2")}, cites=("SiT-S/2", "SiT-XL/2 recipe")),
    "sit-tiny-fmnist": shrink(SIT_XL2, "sit-xl2", {"train.lr": "train.lr", "train.base_lr": "base_lr",
                                                    "train.ema_warmup": "ema_warmup"}),
    "uvit-s2": UVIT_S2,
    "uvit-m2": UVIT_M2,
    "uvit-tiny-fmnist": shrink(UVIT_S2, "uvit-s2", {"train.lr": "train.lr", "train.base_lr": "base_lr", "train.beta1": "beta1",
                                                     "train.ema_warmup": "ema_warmup", "data.augment": "augment"}),
}
for _name in ("mae-b16", "mae-s16", "mae-l16", "mae-tiny-digits", "mae-tiny-fmnist", "mae-tiny-fmnistm"):
    RECIPES[f"{_name}-plain"] = derive(RECIPES[_name], PLAIN_MAE, cites=(f"baseline for {_name}",),
                                       keep_batch=RECIPES[_name].batch is not None)
for _name in ("sit-tiny-fmnist", "uvit-tiny-fmnist"):
    RECIPES[f"{_name}-plain"] = derive(RECIPES[_name], PLAIN_DIFFUSION, cites=(f"baseline for {_name}",), keep_batch=False)


def resolved(name: str) -> tuple[dict, set]:
    """The preset's every value as ``section.key`` (its bases merged, dataclass defaults filled in), and the
    keys its YAML files set."""
    raw = _read_preset(name)
    family = (raw.get("model") or {}).get("family", "mae")
    classes = {"model": model_config_class(family), "data": DataConfig, "train": TrainConfig}
    values, given = {}, set()
    for section, cls in classes.items():
        own = raw.get(section) or {}
        given |= {f"{section}.{k}" for k in own}
        values.update({f"{section}.{k}": v for k, v in {**asdict(cls()), **own}.items()})
    return values, given


def comment_of(name: str) -> str:
    """The preset's comments, one line of text (a phrase may wrap in the file)."""
    parts = [line.split("#", 1)[1].strip() for line in preset_text(name).splitlines() if "#" in line]
    return " ".join(parts)


def test_every_preset_has_a_recipe_row():
    assert set(RECIPES) == set(list_presets()), "add a row to RECIPES for each new preset (and drop removed ones)"


@pytest.mark.parametrize("name", list_presets())
def test_preset_matches_the_recipe_it_cites(name):
    """issue 23.9: linprobe-mae cropped at scale 0.2-1 (MAE's main_linprobe.py: 0.08-1) and finetune-mae
    decayed to min_lr 0 (main_finetune.py: 1e-6); both fail here at HEAD."""
    assert name in RECIPES, f"preset {name} has no recipe row in tests/train/test_presets_recipes.py"
    recipe, (values, given) = RECIPES[name], resolved(name)
    for key, (expected, source) in recipe.values.items():
        got = values[key]
        same = got == pytest.approx(expected) if isinstance(expected, float) else got == expected
        assert same, f"{name}: {key} is {got!r}, the recipe says {expected!r} ({source})"
    uncovered = sorted(given - set(recipe.values) - recipe.free - OPERATIONAL)
    assert not uncovered, f"{name} sets {uncovered}, which its recipe row does not check"
    comment = comment_of(name)
    for words in recipe.cites:
        assert words in comment, f"{name}'s comment does not say {words!r}"
    if recipe.batch is not None:
        per_device = values["train.batch_size"] * values["train.accum_steps"]
        assert per_device * recipe.gpus == recipe.batch, f"{name}: {recipe.gpus} x {per_device} != {recipe.batch}"
    for key, (steps, per_epoch) in recipe.steps.items():
        assert values[key] * per_epoch == pytest.approx(steps, rel=0.01), f"{name}: {key} is not {steps} steps"


def test_shrunk_presets_keep_the_non_size_values():
    """Tiny CPU presets name the preset they shrink and change only sizes, data and budget, plus the keys
    their comment names (the row's ``free`` keys); everything else is checked above to equal the parent's
    recipe. Here: each named key really differs (else the row, or the comment, is stale)."""
    for name, recipe in RECIPES.items():
        parent = next((c.split()[1] for c in recipe.cites if c.startswith("Shrinks ")), None)
        if parent is None:
            continue
        values, _ = resolved(name)
        for key in recipe.free - SIZE:
            if key in RECIPES[parent].values:
                assert values[key] != RECIPES[parent].values[key][0], f"{name} keeps {key}: drop it from the row"
