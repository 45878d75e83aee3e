"""Writes to the importer's stdout, as ``import this`` does."""

from tests.security.hostile import mark

mark("prints_on_import")
print("HOSTILE: printed on import")
