"""Ends the process that imports it, as ``sys.exit`` in a module's body would."""

from tests.security.hostile import mark

mark("exits_on_import")
raise SystemExit(3)
