"""Subcommands: (to be written)."""

from typing import Any


def register(sub: Any) -> None:
    """Add this module's subcommands to the parser."""
