"""Every command README.md and the docs/ pages show (and every ``examples:`` line of ``resdecay SUBCOMMAND
--help``), and every ```python block, extracted as a user would copy them (``readme_commands.py`` says how the
executable-docs test runs each)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PREFIXES = ("resdecay", "torchrun", "python", ".venv/bin/")  # a shell line starting so is a command
SHELL_FENCES = ("bash", "sh", "shell", "")  # ```bash blocks and bare ``` blocks hold shell lines; other languages do not
# Pages whose commands are a measurement log, not a user's recipes: each is the long run (minutes to hours, on a
# named machine, often from a frozen checkout) whose numbers the page reports next to it. Every other page is covered.
LOG_PAGES = {
    "docs/RESULTS.md": "the reproduction log: each command is the run whose numbers it reports (minutes to hours)",
    "docs/speed-notes.md": "the speed log: each command is a timing recipe measured on a named machine",
    "docs/reorg-notes.md": "notes of a past reorganisation: its commands measured two trees of that time (/tmp/base)",
}


def pages() -> list[Path]:
    """README.md and every docs/*.md page but the logs, README first."""
    return [README, *(p for p in sorted(DOCS.glob("*.md")) if page_name(p) not in LOG_PAGES)]


def page_name(path: Path) -> str:
    """A page as the tables name it: its path from the repository root."""
    return path.relative_to(ROOT).as_posix()


def split_commands(line: str) -> list[list[str]]:
    """The argv of each command on a shell line: comment dropped, ``&&`` chains split, quotes removed.

    Args:
        line: one line of a shell block (continuation lines already joined).
    """
    out, cur = [], []
    for tok in shlex.split(line, comments=True):
        if tok == "&&":
            out.append(cur)
            cur = []
        else:
            cur.append(tok)
    return [c for c in [*out, cur] if c]


def key(argv: list[str]) -> str:
    """The normalised form of a command: its argv joined by single spaces (the table's key)."""
    return " ".join(argv)


def shell_lines(text: str) -> list[str]:
    """The lines of a page's shell blocks (```bash, ```sh, ```shell or bare ```), a line ending in ``\\``
    joined with the next as the shell joins it."""
    lines = []
    for lang, block in re.findall(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", text, re.S | re.M):
        if lang in SHELL_FENCES:
            lines += re.sub(r"\\\n", " ", block).splitlines()
    return lines


def readme_bash_commands(text: str | None = None) -> list[list[str]]:
    """argv of every command in a page's shell blocks, in order.

    Args:
        text: a page's text (default: README.md's).
    """
    text = README.read_text() if text is None else text
    cmds = []
    for line in shell_lines(text):
        if line.strip().startswith(PREFIXES):
            cmds += [c for c in split_commands(line) if c[0].startswith(PREFIXES)]
    return cmds


def page_commands() -> dict[str, list[str]]:
    """Every command of README and the covered docs pages: key -> the pages that show it."""
    shown: dict[str, list[str]] = {}
    for path in pages():
        for argv in readme_bash_commands(path.read_text()):
            shown.setdefault(key(argv), []).append(page_name(path))
    return shown


def help_examples() -> list[list[str]]:
    """argv of every line under ``example:`` / ``examples:`` in each subcommand's --help."""
    from resdecay.cli.main import build_parser

    cmds = []
    for action in build_parser()._actions:
        for sub in (getattr(action, "choices", None) or {}).values():
            epilog = getattr(sub, "epilog", None) or ""
            body = epilog.split("example:" if "example:" in epilog else "examples:", 1)[-1] if "example" in epilog else ""
            cmds += [c for line in body.splitlines() if line.strip() for c in split_commands(line)]
    return cmds


def python_blocks(text: str | None = None, page: str = "") -> dict[str, str]:
    """A page's ```python blocks keyed by the heading they stand under (``#`` title before the first ``##``),
    prefixed by ``page: `` when a page is named; a second block under one heading gets `` #2``.

    Args:
        text: a page's text (default: README.md's).
        page: the page's name (``page_name``), or "" for bare headings.
    """
    text = README.read_text() if text is None else text
    blocks: dict[str, str] = {}
    for section in re.split(r"^## ", text, flags=re.M):
        title = section.splitlines()[0].strip() if section.strip() else ""
        for i, block in enumerate(re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)):
            name = f"{page}: {title}" if page else title
            blocks[name if i == 0 else f"{name} #{i + 1}"] = block
    return blocks


def all_python_blocks() -> dict[str, str]:
    """Every ```python block of README and the covered docs pages: ``page: heading`` -> code."""
    return {k: v for path in pages() for k, v in python_blocks(path.read_text(), page_name(path)).items()}


def all_commands() -> dict[str, list[str]]:
    """Every distinct command of README, the covered docs pages and the --help examples: key -> argv."""
    cmds = [argv for path in pages() for argv in readme_bash_commands(path.read_text())]
    return {key(c): c for c in [*cmds, *help_examples()]}
