"""Argument types the ``flashcheck`` subcommands share."""

from __future__ import annotations

import argparse

__all__ = ["duration", "positive", "positive_float"]


def positive(text: str) -> int:
    """A positive integer (``argparse`` type)."""
    try:
        val = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if val < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {val}")
    return val


def positive_float(text: str) -> float:
    """A positive number of seconds (``argparse`` type)."""
    try:
        val = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not val > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {val}")
    return val


def duration(text: str) -> float:
    """A duration in seconds from ``90s``, ``3m``, ``1h``, ``2m30s`` or ``2:30`` (``argparse``
    type)."""
    from ..campaign.budget import parse_duration

    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
