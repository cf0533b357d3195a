"""``resdecay checkpoint``'s parser (the command is ``commands/consolidate.py``)."""

from __future__ import annotations

from ..commands.consolidate import run_consolidate


def add_checkpoint_command(sub) -> None:
    """``resdecay checkpoint consolidate``: a sharded (DCP) checkpoint as one file."""
    c = sub.add_parser("checkpoint", help="checkpoint tools: consolidate a sharded (fsdp2 / hsdp) checkpoint into one file")
    tools = c.add_subparsers(dest="tool", required=True, metavar="TOOL")
    s = tools.add_parser("consolidate", help="write a DCP checkpoint folder (<run>/checkpoints/step_N/) as one .pt file")
    s.add_argument("folder", help="the sharded checkpoint: <run>/checkpoints/step_N/")
    s.add_argument("--out", required=True, help="the single file to write (FILE.pt)")
    s.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    s.set_defaults(func=lambda a: run_consolidate(a.folder, a.out, a.overwrite))
