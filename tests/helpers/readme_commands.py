"""The table saying how the executable-docs test runs each command the pages show (``doc_pages.py`` reads them):
shrunk to its smallest size, run by another test already, or why it cannot run here. Their ```python blocks:
``readme_blocks.py``."""

from __future__ import annotations

from dataclasses import dataclass

from .doc_pages import (  # noqa: F401  (the test reads them as readme_commands.NAME)
    DOCS,
    LOG_PAGES,
    PREFIXES,
    README,
    ROOT,
    SHELL_FENCES,
    all_commands,
    all_python_blocks,
    help_examples,
    key,
    page_commands,
    page_name,
    pages,
    python_blocks,
    readme_bash_commands,
    shell_lines,
    split_commands,
)
from .readme_resolve import PLACEHOLDERS, Context, resolve  # noqa: F401  (the test reads them as readme_commands.NAME)


# ----------------------------------------------------------------------------- how each command is shrunk
@dataclass(frozen=True)
class Plan:
    """How the executable-docs test runs one command: the page's argv with PLACEHOLDERS replaced by tiny
    artifacts of the test session, shell globs expanded, then ``add`` appended (later flags and
    ``key=value`` overrides win), so every flag the README shows is still parsed and used."""

    add: tuple[str, ...] = ()  # smallest sizes, outputs in the test's own folder ({tmp})
    skip: str = ""  # why it cannot run here; reported by pytest -ra
    covered: str = ""  # the test that already runs it at its smallest size ("file.py::test_name")
    # a torchrun line: the test that launches this subcommand on 2 processes already ("file.py::test_name", checked
    # like ``covered``); the line's resdecay command then runs here on one process, its own flags and sizes
    torchrun_in: str = ""
    needle: str = ""  # text that test must contain (default: the script's or subcommand's name)
    xfail: str = ""  # a known defect being fixed elsewhere (strict: remove once it passes)
    racy: bool = False  # the defect is a race that a tiny run sometimes wins: xfail not strict
    instead: tuple[str, ...] = ()  # a synopsis line ("[--data a|b]") is run as this concrete instance
    setup: str = ""  # a workspace recipe to run first (test_readme_commands.Workspace attribute)
    patch: str = ""  # shrink what has no flag for it (test_readme_commands.PATCHES)
    expect: tuple[str, ...] = ()  # files (templates, globs) it must write; "FILE::text": FILE must contain text
    says: tuple[str, ...] = ()  # text (templates) its output must contain: the page's stated results
    timeout: int = 300  # seconds a subprocess (torchrun, benchmark) may take before it is killed



_RUN = ("train.epochs=1", "train.warmup_epochs=0", "train.batch_size=32", "train.log_every=1", "train.threads=1",
        "data.num_workers=0", "train.out_dir={tmp}/run", "--no-progress")
MAE = ("model.embed_dim=32", "model.depth=2", "model.num_heads=2", "model.decoder_embed_dim=32", "model.decoder_depth=1",
       "model.decoder_num_heads=2", *_RUN)
FMNIST = (*MAE, "data.path={fmnist}")
DIT = ("model.embed_dim=32", "model.num_heads=2")
UVIT = (*DIT, "model.depth=3", "data.path={fmnist}", *_RUN)  # U-ViT: in, mid, out blocks (odd depth)
SIT = (*DIT, "model.depth=2", "data.path={fmnist}", *_RUN)  # SiT: two mirrored halves
SIT_LATENT = (*DIT, "model.depth=2", *_RUN, "model.img_size=4", "model.num_classes=10",  # the digits' 4x4x4 latents
              "data.train_subset=64", "train.batch_size=8")
IMAGENET = ("model.img_size=32", "model.patch_size=8", "data.train_subset=8", *MAE, "train.batch_size=4")
FIGURES = ("--per-class", "3", "--images", "2", "--out", "{tmp}/figures")
HEADS = ("model.num_heads=2", "model.decoder_num_heads=2")  # the weights are 32 wide
EVAL_SIZE = ("--max-train", "64", "--max-test", "32", "--probe-epochs", "5")
EVAL = (*EVAL_SIZE, "--out", "{tmp}/eval", "--no-progress")
DIAG = ("--diag-images", "16", "--diag-train-images", "32", "--knockout-images", "8")
PROBES = ("--max-train", "200", "--metric-option", "ep.epochs=1", "--metric-option", "attentive.epochs=1",
          "--metric-option", "linear_sweep.epochs=1", "--metric-option", "fewshot.draws=1")  # a validation image a class
GRID = (*FMNIST, "data.train_subset=64", "--out", "{tmp}/grid")
ONLINE_GRID = (*GRID, "train.online_eval_size=32", "train.loggers=[csv]")  # CSV alone: no figures at each online eval
RESUMED = ("{tmp}/run/summary.json::step_00000004.pt",)  # resumed from the checkpoint the kill left (of 5 steps)
FT_IMAGENET = (*_RUN, "train.batch_size=8")  # the ImageFolder stand-in has 24 training images
IMPORTED = ("--import-override", "model.num_heads=2", "--import-override", "model.decoder_num_heads=2", *FT_IMAGENET)
# pretrain --from the workspace's MAE .pth / ViTMAE folder: the run's model at their sizes (mae-tiny-digits-plain's, RGB)
FROM_TINY = ("model.img_size=8", "model.patch_size=2", "model.embed_dim=32", "model.depth=4", "model.num_heads=2",
             "model.decoder_embed_dim=32", "model.decoder_depth=2", "model.decoder_num_heads=2", *FT_IMAGENET)
GPU = "needs a CUDA GPU"
BENCH = "tests/e2e/test_benchmarks.py::"
SETUP = "sets up the environment this test runs in (CI runs it: .ci/run)"
EXT = "tests/eval/test_extending.py::"
SOURCE_TEST = "test_a_source_of_pretrained_weights_in_one_file_runs_through_import_weights_finetune_and_pretrain"
SEG = "tests/eval/test_segmentation.py::"

FSDP = "tests/train/test_fsdp2.py::"
PLANS: dict[str, Plan] = {
    # setting up
    "python3 -m venv .venv": Plan(skip=SETUP),
    ".venv/bin/pip install torch==2.14.1 torchvision==0.29.1": Plan(skip=SETUP),
    ".venv/bin/pip install -e .": Plan(skip=SETUP),
    ".venv/bin/pip install -e .[test]": Plan(skip=SETUP),
    ".venv/bin/python -m pytest -q -m not gpu -n auto": Plan(skip="the test suite itself (this test is part of it)"),
    ".venv/bin/resdecay demo": Plan(skip="the same command as `resdecay demo`, run under that name"),
    # the demos (no size flags: their recipes are shrunk in place, see PATCHES)
    "resdecay demo": Plan(add=("--no-progress", "--out", "{tmp}/demo"), patch="demo", expect=("{tmp}/demo/results.json",)),
    "resdecay demo --data digits --epochs 2": Plan(add=("--no-progress", "--out", "{tmp}/demo"), patch="demo"),
    "resdecay demo [--data digits|fashion-mnist|fashion-mnist-m] [--epochs N] [--alpha-min 0.6] [--seed N] [--threads N]": Plan(
        instead=("resdecay", "demo", "--data", "fashion-mnist-m", "--epochs", "1", "--alpha-min", "0.6", "--seed", "1",
                 "--threads", "1"),
        add=("--no-progress", "--out", "{tmp}/demo"), patch="demo"),
    "resdecay demo --diffusion": Plan(add=("--no-progress", "--out", "{tmp}/demo"), patch="demo_diffusion"),
    # alpha, presets, pretrain
    "resdecay alpha --depth 24 --alpha-min 0.7": Plan(expect=("runs/alpha/*.png",), says=("alpha_eff = 3.149e-04",)),
    "resdecay alpha --depth 24 --target-eff 5e-3": Plan(says=("alpha_min 0.795",)),  # README: "alpha_min 0.795 gives ..."
    "resdecay alpha --depth 24 --target-eff 5e-3 --json": Plan(says=('"alpha_min": 0.795',)),
    "resdecay presets": Plan(says=("mae-tiny-fmnist ", "sit-xl2 ", "finetune-mae ")),
    "resdecay pretrain --preset mae-tiny-fmnist": Plan(add=FMNIST, expect=("{tmp}/run/summary.json",)),
    "resdecay pretrain --preset mae-tiny-fmnist-plain": Plan(add=FMNIST, expect=("{tmp}/run/summary.json",)),
    # docs/alternatives.md: the designs beside the decay, each a setting of the MAE
    "resdecay pretrain --preset mae-tiny-fmnist model.shortcut=orthogonal_decay": Plan(add=FMNIST,
        expect=("{tmp}/run/summary.json::orthogonal_decay",)),
    "resdecay pretrain --preset mae-tiny-fmnist alpha_min=1.0 model.hyper_streams=4": Plan(add=FMNIST,
        expect=("{tmp}/run/summary.json::hyper_connections",)),
    "resdecay pretrain --preset mae-tiny-fmnist model.hyper_streams=4 model.hyper_variant=mhc": Plan(add=FMNIST,
        expect=("{tmp}/run/summary.json::mhc",)),
    "resdecay pretrain --preset mae-tiny-fmnist alpha_min=1.0 model.branch_scale=layerscale": Plan(add=FMNIST,
        expect=("{tmp}/run/summary.json::layerscale",)),
    "resdecay pretrain --preset mae-tiny-fmnist alpha_min=1.0 model.drop_identity=0.1": Plan(add=FMNIST,
        expect=("{tmp}/run/summary.json::drop_identity",)),
    ".venv/bin/python benchmarks/residual_designs.py": Plan(covered="tests/e2e/test_benchmarks.py::"
                                                           "test_residual_designs_times_every_design_against_the_plain_step",
                                                           needle="residual_designs.py"),
    ".venv/bin/python benchmarks/fsdp_memory.py": Plan(
        covered=BENCH + "test_fsdp_memory_reads_each_ranks_share_off_the_sharded_state", needle="fsdp_memory.py"),
    ".venv/bin/python benchmarks/parallel_step.py --device cuda": Plan(skip=GPU),
    "resdecay pretrain --preset mae-tiny-fmnist alpha_min=0.7 train.epochs=50": Plan(add=FMNIST,
                                                                                      expect=("{tmp}/run/summary.json",)),
    "resdecay pretrain --preset mae-tiny-fmnist --resume auto": Plan(add=(*FMNIST, "train.ckpt_every=1"), setup="killed_run",
                                                                     expect=RESUMED),
    "resdecay pretrain --preset mae-tiny-fmnist alpha_min=0.7 train.epochs=50 --resume auto": Plan(
        add=(*FMNIST, "train.ckpt_every=1"), setup="killed_run", expect=RESUMED),
    "resdecay pretrain --preset mae-b16 --print-config data.path=/data/imagenet": Plan(says=("path: {imagefolder}",)),
    "resdecay pretrain --preset mae-tiny-fmnist train.online_eval_every=2": Plan(
        add=(*FMNIST, "train.epochs=2", "train.online_eval_size=32")),
    "resdecay pretrain --preset uvit-tiny-fmnist alpha_min=0.7": Plan(add=UVIT),
    "resdecay pretrain --preset sit-tiny-fmnist": Plan(add=SIT),
    # docs/diffusion.md: REPA and the dispersive loss (train.aux); vit.pth is ViT-S's heads at 32 px in 8-px patches
    "resdecay pretrain --preset sit-tiny-fmnist train.aux=dispersive": Plan(add=SIT, expect=("{tmp}/run/log.jsonl::loss_aux",)),
    "resdecay pretrain --preset sit-tiny-fmnist train.aux=repa train.aux_target=runs/mae-tiny-fmnist/checkpoints/step_00007020.pt":
        Plan(add=(*SIT, "train.aux_proj_dim=64"), expect=("{tmp}/run/summary.json::aux_target_s",)),
    "resdecay pretrain --preset sit-tiny-fmnist train.aux=repa train.aux_target=timm:vit_small_patch16_224 "
    "train.aux_target_weights=vit.pth": Plan(
        add=(*SIT, "train.aux_target_args={{img_size: 32, patch_size: 8, depth: 4, embed_dim: 192}}", "train.aux_proj_dim=64"),
        expect=("{tmp}/run/summary.json::aux_target_s",)),
    "resdecay pretrain --preset sit-tiny-fmnist train.online_eval_every=1 train.online_eval_size=1000": Plan(
        add=(*SIT, "train.online_eval_size=130")),
    "torchrun --nproc_per_node 8 -m resdecay pretrain --preset mae-b16 data.path=/data/imagenet": Plan(
        add=IMAGENET, torchrun_in="tests/train/test_torchrun.py::ddp_run"),
    # docs/training.md "Past DDP": the digits MAE of test_fsdp2.py stands for Fashion-MNIST (the same code path)
    "torchrun --nproc_per_node 2 -m resdecay pretrain --preset mae-tiny-fmnist train.parallel=fsdp2": Plan(
        covered=FSDP + "test_hsdp_on_two_nodes_killed_then_resumed_as_fsdp2_on_two_trains_as_one_process", needle="mesh shard 2"),
    "torchrun --nproc_per_node 2 -m resdecay pretrain --preset mae-tiny-fmnist train.parallel=fsdp2 --resume auto": Plan(
        covered=FSDP + "test_hsdp_on_two_nodes_killed_then_resumed_as_fsdp2_on_two_trains_as_one_process", needle="resumed from"),
    "resdecay checkpoint consolidate runs/mae-tiny-fmnist/checkpoints/step_00000020 --out step_00000020.pt": Plan(
        covered=FSDP + "test_consolidated_checkpoint_equals_the_state_gathered_from_the_shards", needle="consolidate"),
    "torchrun --nproc_per_node 8 -m resdecay pretrain --preset sit-xl2 data.path=/data/imagenet-latents": Plan(
        add=SIT_LATENT, torchrun_in="tests/train/test_aux_losses.py::test_torchrun_ranks_share_one_projector"),
    # data
    "resdecay check-data --data-path /data/imagenet": Plan(add=("--no-progress",)),
    "resdecay check-data --data digits": Plan(add=("--no-progress",)),
    "resdecay check-data --preset mae-b16 data.path=/data/imagenet": Plan(add=("--no-progress",)),
    "resdecay latents --vae /models/sd-vae-ft-ema --data imagefolder --data-path /data/in100 --img-size 256 "
    "--out /data/in100-latents":
        Plan(add=("--img-size", "16", "--no-progress"), expect=("{tmp}/latents/train.pt",)),
    # measuring
    "resdecay eval runs/mae-tiny-fmnist/checkpoints/step_00007020.pt": Plan(add=EVAL, expect=("{tmp}/eval/*/eval.json",)),
    "resdecay eval RUN_A/checkpoints/step_*.pt RUN_B/checkpoints/step_*.pt --layer all": Plan(add=EVAL),
    "resdecay eval runs/mae-tiny-fmnist-plain/checkpoints/step_*.pt runs/mae-tiny-fmnist/checkpoints/step_*.pt": Plan(
        add=EVAL, expect=("{tmp}/eval/*/eval.json",)),
    "resdecay compare RUN_A RUN_B": Plan(add=("--out", "{tmp}/compare"), setup="evaluated"),
    "resdecay compare runs/mae-tiny-fmnist-plain runs/mae-tiny-fmnist": Plan(add=("--out", "{tmp}/compare"), setup="evaluated"),
    "resdecay finetune CKPT --preset finetune-mae train.epochs=100": Plan(add=_RUN, expect=("{tmp}/run/eval.json",)),
    "resdecay finetune CKPT --preset linprobe-mae": Plan(add=_RUN),
    "resdecay finetune runs/mae-tiny-fmnist/checkpoints/step_00007020.pt --preset linprobe-mae": Plan(add=_RUN),
    "resdecay train-supervised --preset resnet18-cifar10 alpha_min=0.7 data.path=/data/cifar": Plan(add=("model.width=8", *_RUN)),
    "resdecay plot RUN_06 RUN_08 RUN_10": Plan(add=("--out", "{tmp}/plot")),
    "resdecay plot runs/mae-tiny-fmnist-plain runs/mae-tiny-fmnist --out runs/plot": Plan(),
    "resdecay figures PLAIN_CKPT DECAYED_CKPT": Plan(add=FIGURES),
    "resdecay figures PLAIN/checkpoints/step_00007020.pt DECAYED/checkpoints/step_00007020.pt": Plan(add=FIGURES),
    "resdecay figures runs/mae-tiny-fmnist-plain/checkpoints/step_*.pt runs/mae-tiny-fmnist/checkpoints/step_*.pt": Plan(
        add=FIGURES, expect=("{tmp}/figures/*.png",)),
    # fine-tuning (docs/finetune.md): --from each format, and eval-classifier on a finetune-mae run's best.pt
    "resdecay finetune --from runs/mae-b16/checkpoints/step_00500000.pt": Plan(add=FT_IMAGENET,
                                                                                expect=("{tmp}/run/checkpoints/best.pt",)),
    "resdecay finetune --from mae_pretrain_vit_base.pth --import-preset mae-b16-plain data.path=/data/imagenet": Plan(
        add=IMPORTED, expect=("{tmp}/run/summary.json::\"mae\"",)),
    "resdecay finetune --from unet_mae.pth --import-preset mae-b16 --preset linprobe-mae data.path=/data/imagenet": Plan(
        add=IMPORTED, expect=("{tmp}/run/summary.json::unet-mae",)),
    "resdecay finetune --from vit-mae-base/ --import-preset mae-b16-plain data.path=/data/imagenet": Plan(
        add=FT_IMAGENET, expect=("{tmp}/run/summary.json::hf-vitmae",)),
    # continuing pretraining (docs/training.md): the imported weights' sizes (the digits MAE, RGB) as the run's model
    "resdecay pretrain --preset mae-b16-plain --from mae_pretrain_vit_base.pth data.path=/data/imagenet": Plan(
        add=(*FROM_TINY, "--import-override", "model.num_heads=2", "--import-override", "model.decoder_num_heads=2"),
        says=("continuing pretraining from",), expect=("{tmp}/run/summary.json::\"mae\"", "{tmp}/run/pretrained.json")),
    "resdecay pretrain --preset mae-b16-plain --from vit-mae-base/ data.path=/data/imagenet": Plan(
        add=FROM_TINY, says=("continuing pretraining from",), expect=("{tmp}/run/summary.json::hf-vitmae",)),
    "resdecay eval-classifier runs/mae-b16/finetune-mae/checkpoints/best.pt": Plan(
        setup="mae_b16_finetuned", add=("--out", "{tmp}/classifier.json", "--no-progress"), expect=("{tmp}/classifier.json",)),
    "resdecay eval-classifier CKPT --split train --data-path /data/imagenet --out ft.json": Plan(
        instead=("resdecay", "eval-classifier", "runs/mae-b16/finetune-mae/checkpoints/best.pt", "--split", "train",
                 "--data-path", "/data/imagenet", "--out", "ft.json"),
        setup="mae_b16_finetuned", add=("--no-progress",), expect=("ft.json::train",)),
    # data at scale (docs/data-at-scale.md): shards of the ImageFolder stand-in, a datasets folder with renamed columns
    "resdecay shard --data-path /data/in100 --out /data/in100-shards --shard-size 1000": Plan(
        add=("--out", "{tmp}/shards", "--shard-size", "8", "--no-progress"),
        expect=("{tmp}/shards/train-000002.tar", "{tmp}/shards/val-000000.tar", "{tmp}/shards/classes.txt")),
    "resdecay pretrain --preset mae-b16 data.name=wds data.path=/data/in100-shards": Plan(
        add=IMAGENET, expect=("{tmp}/run/summary.json",)),
    "resdecay pretrain --preset mae-b16 data.name=wds data.path=/data/shards/train-{000000..000127}.tar "
    "data.val_path=/data/shards/val-{000000..000009}.tar": Plan(add=IMAGENET, expect=("{tmp}/run/summary.json",)),
    "resdecay pretrain --preset mae-b16 data.name=hf data.path=/data/in100-hf data.image_column=img data.label_column=cls":
        Plan(add=IMAGENET, expect=("{tmp}/run/summary.json",)),
    "resdecay finetune runs/mae-b16/checkpoints/step_*.pt --preset linprobe-mae": Plan(add=FT_IMAGENET,
                                                                                        expect=("{tmp}/run/eval.json",)),
    "resdecay eval runs/mae-b16/checkpoints/step_*.pt --evals knn,rank": Plan(add=EVAL, expect=("{tmp}/eval/*/eval.json",)),
    "resdecay eval CKPT --data wds --data-path /data/in100-shards": Plan(
        instead=("resdecay", "eval", "runs/mae-b16/checkpoints/step_00500000.pt", "--data", "wds", "--data-path",
                 "/data/in100-shards"), add=EVAL, expect=("{tmp}/eval/*/eval.json::wds",)),
    "resdecay check-data --data wds --data-path /data/in100-shards": Plan(add=("--no-progress",),
                                                                          says=("train: 24 images, 0 unreadable",)),
    # residual-stream diagnostics (docs/diagnostics.md): a checkpoint, a timm ViT's weights file, a transformers folder
    "resdecay eval CKPT --evals knn,diagnostics": Plan(add=(*EVAL, *DIAG), expect=("{tmp}/eval/*/diagnostics.png",)),
    "resdecay eval --model timm:vit_small_patch16_224 --weights vit.pth --data cifar10 --data-path /data/cifar --evals "
    "knn,probe,diagnostics": Plan(add=("--model-arg", "img_size=32", "--model-arg", "patch_size=8", "--model-arg", "depth=4",
                                       "--model-arg", "embed_dim=192", *EVAL, *DIAG),
                                  expect=("{tmp}/eval/timm-vit_small_patch16_224/diagnostics.png",)),
    "resdecay eval --model vit-mae-base/ --data imagefolder --data-path /data/imagenet --evals knn,diagnostics": Plan(
        add=(*EVAL, *DIAG), expect=("{tmp}/eval/*/diagnostics.png",)),
    # probing (docs/probing.md): every probe on a checkpoint, per block, a timm ViT's weights file, a leaderboard row
    "resdecay eval CKPT --evals knn,probe,ep,attentive,linear_sweep,knn_sweep,fewshot": Plan(
        add=(*EVAL, *PROBES), expect=("{tmp}/eval/*/eval.json::linear_sweep",)),
    "resdecay eval PLAIN_CKPT DECAYED_CKPT --layer all --evals knn,ep,linear_sweep": Plan(
        add=(*EVAL, *PROBES), expect=("{tmp}/eval/profile_overlay.png",)),
    "resdecay eval --model timm:vit_small_patch16_224 --weights vit.pth --data cifar10 --data-path /data/cifar --evals ep":
        Plan(add=("--model-arg", "img_size=32", "--model-arg", "patch_size=8", "--model-arg", "depth=4", "--model-arg",
                  "embed_dim=192", *EVAL, *PROBES, "--metric-option", "ep.val_fraction=0.5"), expect=("{tmp}/eval/timm-vit_small_patch16_224/eval.json::ep",)),
    "resdecay eval runs/sit-tiny-fmnist/checkpoints/step_*.pt --noise-level 0.1 --evals knn,linear_sweep,ep": Plan(
        add=(*EVAL, *PROBES), expect=("{tmp}/eval/*/eval.json::\"level\": 0.1",)),
    "resdecay eval CKPT --evals knn,probe,ep,knn_sweep --export-row row.csv": Plan(
        add=(*EVAL, *PROBES, "--export-row", "{tmp}/row.csv"), expect=("{tmp}/row.csv::knn_k",)),
    # segmentation (docs/segmentation.md): label maps of Fashion-MNIST-M and a COCO-Stuff-27 folder, in these tests
    "resdecay eval runs/plain/checkpoints/step_*.pt runs/decayed/checkpoints/step_*.pt --evals segmentation": Plan(
        covered=SEG + "test_eval_reports_segmentation_with_protocol_card_and_baselines", needle='"segmentation"'),
    "resdecay eval CKPT --evals segmentation --seg-data cocostuff27 --seg-path DIR --seg-images 100": Plan(
        covered="tests/data/test_segmentation_data.py::test_eval_segments_a_cocostuff27_folder_and_refuses_data_without_masks",
        needle='"--seg-data", "cocostuff27", "--seg-path"'),
    "resdecay eval CKPT --evals segmentation --seg-data folder:my-seg --seg-images 12": Plan(  # the page's folder
        setup="seg_folder", add=("--no-progress", "--out", "{tmp}/eval"), says=("iou: ground ",),
        expect=('{tmp}/eval/*/eval.json::"class_names": [\n', '{tmp}/eval/*/eval.json::"plugins": [')),
    "resdecay figures PLAIN.pt DECAYED.pt --segmentation --seg-images 100 --images 8": Plan(
        covered=SEG + "test_figures_segmentation_draws_both_pngs", needle='"--segmentation"'),
    # extending (docs/EXTENDING.md): a plugin registers into the process's registries, so each runs in the test that
    # restores them afterwards (tests/eval/test_extending.py checks the page still shows the command it runs)
    "resdecay --plugin docs/examples/extending/two_minus.py ablate --grid docs/examples/extending/two_minus-digits.yaml "
    "--out runs/ablate/two-minus": Plan(covered=EXT + "test_a_residual_formula_in_one_file_runs_through_ablate",
                                        needle="two_minus.py ablate --grid"),
    "resdecay --plugin docs/examples/extending/mixer.py pretrain --preset docs/examples/extending/mixer-digits.yaml": Plan(
        covered=EXT + "test_a_family_in_one_file_trains_resumes_and_is_evaluated_by_the_cli", needle="mixer.py pretrain --preset"),
    "resdecay --plugin docs/examples/extending/mixer.py eval runs/mixer-digits/checkpoints/step_00000440.pt": Plan(
        covered=EXT + "test_a_family_in_one_file_trains_resumes_and_is_evaluated_by_the_cli",
        needle="mixer.py eval runs/mixer-digits/checkpoints/"),
    "resdecay --plugin docs/examples/extending/rankme.py eval runs/mixer-digits/checkpoints/step_00000440.pt --evals knn,rankme":
        Plan(covered=EXT + "test_a_family_in_one_file_trains_resumes_and_is_evaluated_by_the_cli",
             needle="rankme.py eval runs/mixer-digits/checkpoints/"),
    "resdecay --plugin docs/examples/extending/cka.py eval runs/mixer-digits/checkpoints/step_00000440.pt --evals cka":
        Plan(covered=EXT + "test_a_metric_over_two_blocks_in_one_file_runs_through_eval",
             needle="cka.py eval runs/mixer-digits/checkpoints/"),
    "resdecay --plugin docs/examples/extending/cka.py eval runs/mixer-digits/checkpoints/step_00000440.pt --evals knn,cka "
    "--layer all --metric-option cka.reference=-1": Plan(
        covered=EXT + "test_a_metric_over_two_blocks_in_one_file_runs_through_eval", needle="cka.reference=-1"),
    "resdecay --plugin docs/examples/extending/reconstruction.py eval RUN/checkpoints/step_N.pt --evals knn,recon_mse":
        Plan(covered=EXT + "test_a_new_input_kind_in_one_file_runs_through_eval", needle="reconstruction.py eval RUN/"),
    "resdecay --plugin docs/examples/extending/model_format.py eval --model zoo:digits-vit --weights W.pth --data digits":
        Plan(covered=EXT + "test_a_model_format_in_one_file_runs_through_eval", needle="model_format.py eval --model zoo:"),
    "resdecay --plugin docs/examples/extending/lab_mae.py import-weights lab_run.pt --format lab-mae --preset mae-b16 --out lab.pt":
        Plan(covered=EXT + SOURCE_TEST, needle="lab_mae.py import-weights lab_run.pt"),
    "resdecay --plugin docs/examples/extending/lab_mae.py finetune --from lab_run.pt --import-preset mae-b16 "
    "data.path=/data/imagenet": Plan(covered=EXT + SOURCE_TEST, needle="lab_mae.py finetune --from lab_run.pt"),
    # interop (the foreign files are tiny fakes in each format: tests/helpers/interop.py)
    "resdecay import-weights mae_pretrain_vit_base.pth --format mae --preset mae-b16-plain --out mae.pt": Plan(
        add=HEADS, expect=("mae.pt",)),
    "resdecay import-weights mae_pretrain_vit_base.pth --format mae --preset mae-b16-plain --out runs/imported/mae-b16.pt "
    "data.path=/data/imagenet": Plan(add=HEADS),
    "resdecay import-weights unet_mae.pth --format unet-mae --preset mae-b16 --out unet.pt": Plan(  # alpha from args.min_decay
        add=HEADS, expect=("unet.pt",)),
    "resdecay import-weights vit.pth --format timm-vit --preset mae-s16 model.num_heads=6 --out vit.pt": Plan(expect=("vit.pt",)),
    "resdecay export runs/mae-tiny-fmnist/checkpoints/step_00007020.pt --to timm --out vit.safetensors": Plan(
        expect=("vit.safetensors",)),
    "resdecay import-weights ./vit-mae-folder --format hf-vitmae --preset mae-tiny-digits-plain --out imported.pt": Plan(
        expect=("imported.pt",)),  # the heads are in config.json
    "resdecay export imported.pt --to hf-vitmae --out ./vit-mae-again": Plan(
        setup="imported_vitmae", expect=("vit-mae-again/config.json::vit_mae", "vit-mae-again/model.safetensors")),
    # training in transformers' Trainer and diffusers' scheduler loop (docs/plug-and-play.md): CI-sized in these tests
    "python docs/examples/hf_trainer_vitmae.py --steps 60 --out runs/hf-trainer-vitmae --seed 0": Plan(
        covered="tests/e2e/test_hf_examples.py::test_vitmae_trains_in_the_hf_trainer_and_reloads_through_from_pretrained_and_restore"),
    "python docs/examples/diffusers_dit.py --steps 150 --out runs/diffusers-dit --seed 0": Plan(
        covered="tests/e2e/test_hf_examples.py::test_dit_trains_with_ddpm_and_samples_with_the_scheduler_loop"),
    "python docs/examples/diffusers_sd3.py --steps 120 --out runs/diffusers-sd3 --seed 0": Plan(
        covered="tests/e2e/test_mmdit_example.py::test_sd3_trains_with_flow_matching_and_reloads_through_from_pretrained_and_restore"),
    "python docs/examples/hf_trainer_clip.py --steps 60 --out runs/hf-trainer-clip --seed 0": Plan(
        covered="tests/e2e/test_hf_examples.py::test_clip_vision_tower_trains_in_the_hf_trainer_and_reloads_through_from_pretrained_and_restore"),
    "resdecay export runs/mae-tiny-fmnist/checkpoints/step_00007020.pt --to hf --out mae-tiny-fmnist-hf": Plan(
        expect=("mae-tiny-fmnist-hf/README.md::alpha_eff", "mae-tiny-fmnist-hf/config.json", "mae-tiny-fmnist-hf/model.safetensors")),
    # ablations: every variant of the grid, each a few steps on the fake data
    # trackers: W&B offline, an MLflow file store, TensorBoard read back, CSV (tests/train/test_trackers.py)
    "resdecay pretrain --preset mae-tiny-fmnist train.loggers=[tensorboard,wandb,mlflow,csv]": Plan(
        add=FMNIST, expect=("{tmp}/run/summary.csv", "{tmp}/run/wandb/*", "{tmp}/run/mlruns/*")),  # W&B offline: conftest
    # cluster: submitit's local executor and a fake sbatch on PATH (tests/cli/test_submit.py)
    "resdecay submit --nodes 2 --gpus-per-node 8 --partition gpu --timeout-min 240 pretrain --preset mae-b16 data.path=/data/in100":
        Plan(covered="tests/cli/test_submit.py::test_slurm_submission_writes_the_sbatch_options_and_the_job_id"),
    "resdecay submit --nodes 2 --gpus-per-node 8 --partition gpu --timeout-min 240 pretrain --preset sit-xl2 "
    "data.path=/data/imagenet-latents train.parallel=hsdp": Plan(
        covered="tests/cli/test_submit.py::test_torchrun_variables_come_from_the_slurm_job_environment",
        needle="node_count(16) == 2"),
    "resdecay ablate --list": Plan(says=("table3b-toy", "where-fmnistm-long")),
    "resdecay ablate --grid table3b-toy": Plan(add=GRID, expect=("{tmp}/grid/table.txt",)),
    "resdecay ablate --grid table3a-toy": Plan(add=GRID),
    "resdecay ablate --grid table2-toy": Plan(add=GRID),
    "resdecay ablate --grid figure7-toy": Plan(add=("model.width=4", "data.path={fmnist}", "data.train_subset=64", *_RUN,
                                                    "--out", "{tmp}/grid"), expect=("{tmp}/grid/rank_vs_depth.png",)),
    "resdecay ablate --grid where-fmnistm --only plain MAE,alpha 0.8,alpha 0.6": Plan(add=GRID),
    "resdecay ablate --grid where-fmnistm --only plain MAE,alpha 0.8": Plan(add=GRID),
    "resdecay ablate --grid where-fmnistm-long": Plan(add=ONLINE_GRID),
    # 3 seeds of 2 of its 3 variants (its alpha 0.6 runs alpha 0.8's code): the pooling over seeds is what it adds
    "resdecay ablate --grid where-small --seeds 0,1,2": Plan(add=(*ONLINE_GRID, "--only", "plain MAE,alpha 0.8"),
                                                             expect=("{tmp}/grid/seed2/table.txt", "{tmp}/grid/table.txt::±")),
    "torchrun --nproc_per_node 4 -m resdecay ablate --grid table2-in100 data.path=/data/imagenet100": Plan(
        add=(*IMAGENET, "data.num_workers=0", "eval.num_workers=0", "--only", "alpha_min 1.0,alpha_min 0.6", "--out", "{tmp}/grid"),
        # 2 variants: rank 1 once started the 2nd's process group while rank 0 evaluated; no 10 loader forks for 32 images
        expect=("{tmp}/grid/ablate.json::\"num_workers\": 0",), timeout=120),
    # diffusion
    "resdecay sample runs/uvit-tiny-fmnist/checkpoints/step_*.pt --n 1000 --sampler dpm-solver++ --steps 25": Plan(
        add=("--n", "4", "--steps", "2", "--out", "{tmp}/samples", "--no-progress"), expect=("{tmp}/samples/*.npz",),
        says=("4 samples | sampler dpm-solver++, 2 steps",)),
    "resdecay fid runs/uvit-tiny-fmnist/samples/samples_*.npz --ref fashion-mnist --proxy": Plan(
        add=("--data-path", "{fmnist}", "--ref-out", "{tmp}/ref.pt", "--no-progress"), says=("proxy FID (",)),
    "resdecay fid samples.npz --ref cifar100 --data-path /data/cifar --inception-weights pt_inception-2015-12-05-6726825d.pth":
        Plan(add=("--allow-few", "--ref-out", "{tmp}/ref.pt", "--no-progress"), setup="cifar100",  # 4 samples, 8 refs
             # random weights in the real file's layout (tests/eval/test_fid.py does the same): so not called FID
             says=("Inception-v3 Frechet distance, NOT FID",)),
    "resdecay eval-diffusion runs/uvit-tiny-fmnist/checkpoints/step_*.pt --noise-levels 0,0.1,0.25,0.5": Plan(
        add=("--max-train", "64", "--max-test", "32", "--out", "{tmp}/grid", "--no-progress")),
    "resdecay plot runs/sit-tiny-fmnist runs/sit-tiny-fmnist-plain --out runs/plot": Plan(expect=("runs/plot/*.png",)),
    "torchrun --nproc_per_node 8 -m resdecay sample runs/sit-xl2/checkpoints/step_00400000.pt --num-samples 50000 --guidance-scale 1.5 "
    "--vae /models/sd-vae-ft-ema": Plan(add=("--num-samples", "3", "--steps", "4", "--device", "cpu", "--out", "{tmp}/samples",
                                             "--no-progress"), expect=("{tmp}/samples/*.npz",),
                                        torchrun_in="tests/cli/test_diffusion_cli.py::test_torchrun_sampling_splits_n_across_ranks"),
    # benchmarks: each script's smoke run lives in tests/e2e/test_benchmarks.py (checked to exist and to run it)
    ".venv/bin/python benchmarks/block_overhead.py": Plan(covered=BENCH + "test_block_overhead_times_both_blocks_per_shape"),
    ".venv/bin/python benchmarks/mae_throughput.py": Plan(
        covered=BENCH + "test_mae_throughput_checks_each_architecture_against_its_reference"),
    ".venv/bin/python benchmarks/data_throughput.py": Plan(
        covered=BENCH + "test_gpu_rows_smoke_mode_runs_data_throughput_on_every_decoder_path"),
    ".venv/bin/python benchmarks/eval_speed.py": Plan(covered=BENCH + "test_eval_speed_sections_agree_with_their_references"),
    ".venv/bin/python benchmarks/startup.py": Plan(covered=BENCH + "test_startup_times_every_row_against_torch_alone"),
    ".venv/bin/python benchmarks/diagnostics_cost.py": Plan(
        covered="tests/e2e/test_diagnostics_benchmark.py::test_smoke_run_times_every_row_against_the_forward",
        needle="diagnostics_cost.py"),
    ".venv/bin/python benchmarks/probing_cost.py": Plan(needle="probing_cost.py", covered="tests/e2e/test_benchmarks.py::"
                                                       "test_probing_cost_times_the_grid_ep_and_a_streamed_pass"),
    ".venv/bin/python benchmarks/hook_cost.py": Plan(needle="hook_cost.py", covered="tests/e2e/test_hook_cost_benchmark.py::"
                                                     "test_smoke_run_times_each_model_and_mode_against_the_undecayified_model"),
    ".venv/bin/python benchmarks/diffusion_throughput.py": Plan(
        covered=BENCH + "test_diffusion_throughput_rows_decayed_and_plain_per_preset"),
    ".venv/bin/python benchmarks/train_end_to_end.py": Plan(
        covered=BENCH + "test_end_to_end_trains_from_jpegs_with_each_decoder"),
    ".venv/bin/python benchmarks/mae_throughput.py --preset mae-b16 --device cuda --batch-size 256 --compile": Plan(skip=GPU),
    ".venv/bin/python benchmarks/batch_sweep.py --preset mae-b16 --device cuda --batches 128,256,384,512 --compile":
        Plan(skip=GPU),
    ".venv/bin/python benchmarks/diffusion_throughput.py --device cuda --preset sit-xl2 --batch-size 256 --compile":
        Plan(skip=GPU),
}
