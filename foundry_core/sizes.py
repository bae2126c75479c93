"""Human sizes: parse_size("1.5GB") and the reverse."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(size: int | str) -> int:
    """Bytes from an int or a string such as "512MiB", "1.5GB", "64k", "4096", "0x2000".

    Decimal units (kB, MB, GB, TB) are powers of 1000 and binary units (KiB, MiB, GiB, TiB) powers
    of 1024, as in the IEC standard. Raises ValueError naming the input when it cannot be read.
    """
    if isinstance(size, bool):
        raise ValueError(f"not a size: {size!r}")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"size must not be negative: {size}")
        return size
    if not isinstance(size, str):
        raise ValueError(f"not a size: {size!r}")
    text = size.strip()
    if text.lower().startswith("0x"):
        try:
            return int(text, 16)
        except ValueError:
            raise ValueError(f"not a size: {size!r}") from None
    match = _PATTERN.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {size!r} (use e.g. 4096, 64KiB, 512MiB, 1.5GB)")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value != int(value):
        raise ValueError(f"{size!r} is not a whole number of bytes")
    return int(value)


def format_size(n: int) -> str:
    """A short binary-unit rendering: 1536 -> '1.5 KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
