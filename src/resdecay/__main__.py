"""``python -m resdecay`` (and ``torchrun ... -m resdecay``) runs the CLI."""

import sys

from .cli import main

sys.exit(main())
