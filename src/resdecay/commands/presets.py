"""``resdecay presets``: the shipped presets, one line each (the first sentence of its leading comment)."""

from __future__ import annotations

from ..io import first_sentence
from ..train.config import list_presets, preset_text


def print_presets() -> None:
    for name in list_presets():
        comment = []
        for line in preset_text(name).splitlines():  # the leading comment, whose first sentence may wrap
            if not line.startswith("#"):
                break
            comment.append(line.lstrip("# "))
        print(f"{name:<24} {first_sentence(' '.join(comment).replace('- ', '-'), 200)}")
