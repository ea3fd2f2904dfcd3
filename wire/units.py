"""Human-readable sizes and times for explanations and the CLI."""

from __future__ import annotations


def fmt_bytes(n: float) -> str:
    """Decimal units, as vendors and the explanation lines use them: 1.46 TB, 80.0 GB, 512 MB."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(value) < 1000 or unit == "PB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")
