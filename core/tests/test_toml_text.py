"""Bounded TOML parsing: nesting up to the bound parses, one level more is a located error."""

from __future__ import annotations

import tomllib

import pytest
from rllm_core.toml_text import MAX_TOML_NESTING, TomlNestingError, load_toml_text


def arrays(depth: int) -> str:
    return "a = " + "[" * depth + "]" * depth


def test_nesting_up_to_the_bound_parses():
    data = load_toml_text(arrays(MAX_TOML_NESTING))
    assert data == tomllib.loads(arrays(MAX_TOML_NESTING))


def test_one_level_more_names_where():
    with pytest.raises(TomlNestingError, match=r"more than 32 levels deep at a\[0\]"):
        load_toml_text(arrays(MAX_TOML_NESTING + 1))
    tables = "[" + ".".join(["t"] * (MAX_TOML_NESTING + 1)) + "]"
    with pytest.raises(TomlNestingError, match=r"at t\.t\.t\.t\.t\.t\.\.\."):
        load_toml_text(tables)


def test_nesting_past_the_parser_is_the_same_error():
    with pytest.raises(TomlNestingError, match="too deeply to parse"):
        load_toml_text(arrays(100_000))


def test_a_syntax_error_is_tomllibs():
    with pytest.raises(tomllib.TOMLDecodeError):
        load_toml_text("a = ")
