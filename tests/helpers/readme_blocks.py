"""How the executable-docs test runs each ```python block the pages show (``doc_pages.py`` reads them): with
text replacements that shrink it, or left to the test that runs it already. The shell commands: ``readme_commands.py``."""

from __future__ import annotations

from .readme_commands import EXT, SOURCE_TEST  # the tests that run the EXTENDING.md examples

# The pages' ```python blocks, by ``page: heading``: run here with these text replacements (each must still match
# the page), or (test, text it must contain) for the test that runs them already.
PYTHON_BLOCKS: dict[str, dict[str, str] | tuple[str, str]] = {
    "README.md: Decayed shortcuts in your model": {'"vit_base_patch16_224"': '"vit_tiny_patch16_224"'},
    "docs/interop.md: Decayed shortcuts in models you already have": {'"vit_base_patch16_224"': '"vit_tiny_patch16_224"'},
    "docs/trackers-and-sharing.md: Sharing a model": {'"runs/mae-tiny-fmnist/checkpoints/step_00007020.pt"': "MAE_CKPT"},
    "docs/python-api.md: Notebook API": ("tests/models/test_api.py::test_readme_notebook_example_runs", "## Notebook API"),
    "docs/python-api.md: Library": {'"runs/mae-tiny-fmnist/checkpoints/step_00007020.pt"': "MAE_CKPT",
                                    "224, 224": "32, 32",  # a small MAE instead of ViT-B/16, whose size is checked apart
                                    "MAEConfig(alpha_min=0.6)": "MAEConfig(alpha_min=0.6, img_size=32, embed_dim=32, depth=8, "
                                                                "num_heads=2, decoder_embed_dim=32, decoder_depth=2, "
                                                                "decoder_num_heads=2)"},
    "docs/python-api.md: Training from Python: `train(cfg, hooks=[...])`": {  # a 4-block encoder: same steps, faster
        '"train.epochs=2", ': '"train.epochs=2", "model.depth=4", "model.embed_dim=32", "model.num_heads=2", '},
    # plug-and-play.md's blocks build transformers / diffusers models and register an adapter: run as one page there
    "docs/plug-and-play.md: # Decayed shortcuts in the models you already have": (
        "tests/nn/test_adapters.py::test_docs_examples_run", "plug-and-play.md"),
    "docs/plug-and-play.md: The paper's model inside transformers": (
        "tests/nn/test_adapters.py::test_docs_examples_run", "plug-and-play.md"),
    "docs/plug-and-play.md: Your own block kind": ("tests/nn/test_adapters.py::test_docs_examples_run", "plug-and-play.md"),
    "docs/interop.md: transformers and diffusers models: what resdecay did is in the model's own config": (
        "tests/interop/test_hf_record.py::test_the_docs_example_runs_as_written", "interop.md"),
    # EXTENDING.md's blocks are excerpts of docs/examples/extending/*.py, which these tests load and run
    "docs/EXTENDING.md: (a) A new residual formula: `x·α + f(x)·(2 − α)`": (
        EXT + "test_a_residual_formula_in_one_file_runs_through_ablate", "two_minus.py"),
    "docs/EXTENDING.md: (a) A new residual formula: `x·α + f(x)·(2 − α)` #2": (
        EXT + "test_a_residual_update_in_one_file_reaches_the_blocks", "half_orthogonal.py"),
    "docs/EXTENDING.md: (b) A new model family: a masked MLP-Mixer with decayed shortcuts": (
        EXT + "test_a_family_in_one_file_trains_resumes_and_is_evaluated_by_the_cli", "mixer.py"),
    "docs/EXTENDING.md: (c) A new metric: RankMe": (
        EXT + "test_a_family_in_one_file_trains_resumes_and_is_evaluated_by_the_cli", "rankme.py"),
    "docs/segmentation.md: Your own images and label maps (`--seg-data folder:DIR`)": {},
    "docs/diagnostics.md: # Residual-stream diagnostics: what the identity path carries": {},
    "docs/EXTENDING.md: (d) A metric over two blocks: linear CKA": (
        EXT + "test_a_metric_over_two_blocks_in_one_file_runs_through_eval", "cka.py"),
    "docs/EXTENDING.md: (e) A new input kind: the MAE's pixel reconstructions": (
        EXT + "test_a_new_input_kind_in_one_file_runs_through_eval", "reconstruction.py"),
    "docs/probing.md: # Probing frozen features as the field does now": (
        "tests/eval/test_probing_api.py::test_the_sweeps_from_python_are_evals_numbers", "resdecay.linear_sweep("),
    "docs/EXTENDING.md: (f) A model format: your lab's architectures by name": (
        EXT + "test_a_model_format_in_one_file_runs_through_eval", "model_format.py"),
    "docs/EXTENDING.md: (g) A new source of pretrained weights: your lab's checkpoint layout": (
        EXT + SOURCE_TEST, "lab_mae.py"),
}

