"""Raises ``KeyboardInterrupt`` from its body, as if Ctrl-C had been pressed."""

from tests.security.hostile import mark

mark("interrupts_on_import")
raise KeyboardInterrupt
