"""``python -m jupyter_runtimeenv``: the CLI."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
