"""interop/'s formats stand side by side (issue 39): every format file imports only the shared checkpoint I/O
below it (checkpoint_io.py, files.py, pretrained_config.py) and its own helpers, never another format, and the
longest import chain inside interop/ is 4 modules (the package's __init__, which re-exports, left out)."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

INTEROP = Path(__file__).resolve().parents[2] / "src" / "resdecay" / "interop"
SHARED = {"checkpoint_io", "files", "pretrained_config"}
FORMATS = {"weights", "export_timm", "file_meta", "foreign_vit", "hf_vitmae", "hf_unet", "pretrained"}
OWN_HELPERS = {"pretrained": {"model_card", "hub_model"}}


def _imports() -> dict[str, set[str]]:
    """module -> the interop modules its ``from .x import`` lines name."""
    out = {}
    for path in INTEROP.glob("*.py"):
        tree = ast.parse(path.read_text())
        out[path.stem] = {node.module.split(".")[0] for node in ast.walk(tree)
                          if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}
    return out


def test_every_format_imports_only_the_shared_layer():
    imports = _imports()
    assert FORMATS | SHARED <= set(imports), sorted(FORMATS | SHARED - set(imports))
    wrong = {m: sorted(imports[m] - SHARED - OWN_HELPERS.get(m, set())) for m in FORMATS}
    assert not any(wrong.values()), wrong
    below = {m: sorted(imports[m] & (FORMATS | {"import_weights"})) for m in SHARED}
    assert not any(below.values()), below  # the shared layer knows no format


def test_the_longest_import_chain_inside_interop_is_four_modules():
    imports = {m: targets for m, targets in _imports().items() if m != "__init__"}

    @lru_cache(None)
    def chain(m: str) -> tuple[str, ...]:
        return max(((m, *chain(t)) for t in imports[m] if t in imports and t != m), key=len, default=(m,))

    longest = max((chain(m) for m in imports), key=len)
    assert len(longest) <= 4, " -> ".join(longest)
