"""Subcommands this package adds to `keel` (see keel.cli.EXTENSION_MODULES)."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add this package's subcommands to the `keel` parser."""
