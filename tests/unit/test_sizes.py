from __future__ import annotations

import pytest

from foundry_core import format_size, parse_size


@pytest.mark.parametrize("text,expected", [
    ("4096", 4096), (4096, 4096), ("64KiB", 65536), ("1.5GB", 1_500_000_000), ("2GiB", 2 << 30),
    ("512mib", 512 << 20), ("0x2000", 0x2000), (" 3 MB ", 3_000_000), ("1TiB", 1 << 40), ("0", 0), ("1k", 1000),
])
def test_parse_size_accepts_common_forms(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "12 parsecs", "-5", -5, "1.5", "0.3B", "0xZZ", True, None, 2.0])
def test_parse_size_rejects_with_the_input_named(bad):
    with pytest.raises(ValueError) as err:
        parse_size(bad)
    assert repr(bad) in str(err.value) or str(bad) in str(err.value)


def test_format_size():
    assert format_size(512) == "512 B"
    assert format_size(1536) == "1.5 KiB"
    assert format_size(3 << 30) == "3.0 GiB"
