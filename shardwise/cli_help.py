"""How shardwise's command lines (``shardwise``, ``shardwise-server``) print their help: a flag shows no value type.

Typer 0.29's rich help prints a type beside every option, ``<bool>`` beside a flag too (``--1d <bool>``, even
``--help <bool>``), which reads as if the flag took a value. :func:`plain_flags` makes a flag's type column empty;
options that take a value keep theirs (``<int>``, ``<text>``...). Both command lines call it when their app is built.
Typer releases without that column (``typer>=0.12`` is what the project asks for) are left as they are.
"""

from __future__ import annotations

from typing import Any

import typer.core

__all__ = ["plain_flags"]


def plain_flags() -> None:
    """Show no value type beside flags in the rich help (idempotent)."""
    option = typer.core.TyperOption
    shown = getattr(option, "display_type_rich", None)
    if shown is None or getattr(shown, "plain_flags", False):  # an older Typer: no type column to clear
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.plain_flags = True  # type: ignore[attr-defined]
    option.display_type_rich = display_type_rich  # type: ignore[method-assign]
