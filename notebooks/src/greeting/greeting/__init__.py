"""A tiny package for the quickstart: installed into a runtime env from notebooks/wheels."""

__version__ = "1.0"


def hello(name: str) -> str:
    return f"hello, {name}!"
