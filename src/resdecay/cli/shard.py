"""``resdecay shard``'s parser (the command is ``commands/shard.py``)."""

from __future__ import annotations

from ..commands.shard import run_shard


def add_shard_command(sub) -> None:
    """``resdecay shard``: the parser of the command."""
    s = sub.add_parser("shard", help="write an ImageFolder as WebDataset tar shards (data.name=wds)")
    s.add_argument("--data-path", required=True, help="the ImageFolder (train/<class>/*, val/<class>/*)")
    s.add_argument("--out", required=True, help="folder for train-NNNNNN.tar / val-NNNNNN.tar and classes.txt")
    s.add_argument("--shard-size", type=int, default=1000, help="images per shard (default 1000)")
    s.add_argument("--no-progress", action="store_true", help="no progress line")
    s.set_defaults(func=lambda a: run_shard(a.data_path, a.out, a.shard_size, not a.no_progress))
