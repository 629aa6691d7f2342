"""Size strings in task files, normalized to MiB."""

from __future__ import annotations

import pytest
from rllm_task_source_harbor.sizes import parse_size_mb


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4G", 4096),
        ("512M", 512),
        ("2GiB", 2048),
        ("1.5G", 1536),
        ("2GB", 2048),
        ("2g", 2048),
        ("512Mi", 512),
        ("512MB", 512),
        ("512MiB", 512),
        ("1T", 1048576),
        ("2048K", 2),
        ("100K", 1),
        ("1048576B", 1),
        ("1024", 1024),
        (" 8 G ", 8192),
        (".5G", 512),
        (2048, 2048),
        (1.5, 2),
        (0.25, 1),
    ],
)
def test_sizes_normalize_to_mib(value, expected):
    assert parse_size_mb(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "is not a size"),
        ("lots", "is not a size"),
        ("4X", "unknown unit 'X'"),
        ("4GX", "unknown unit 'GX'"),
        ("-1G", "is not a size"),
        ("1.5.G", "is not a size"),
        ("0", "is not a positive size"),
        (0, "is not a positive size"),
        (-5, "is not a positive size"),
        (float("inf"), "is not a positive size"),
        (True, "is not a size"),
        (None, "is not a size"),
        ([4], "is not a size"),
    ],
)
def test_bad_sizes_name_the_value(value, message):
    with pytest.raises(ValueError, match=r"is not|unknown unit") as info:
        parse_size_mb(value)
    assert repr(value) in str(info.value)
    assert message in str(info.value)
