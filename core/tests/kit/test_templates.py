"""Template placeholders checked against what a key allows, with messages that say what to do."""

from __future__ import annotations

import pytest
from rllm_core.kit.templates import template_fields


def test_the_placeholders_used_are_returned():
    assert template_fields("{a} and {b}, {{literal}}", ("a", "b", "c"), "k") == {"a", "b"}


def test_an_unknown_placeholder_names_the_key_and_the_allowed_ones():
    with pytest.raises(ValueError) as caught:
        template_fields("{x}", ("a", "b"), "[harness].user_template", hint=" (or not)")
    assert str(caught.value) == (
        "[harness].user_template uses the placeholder {x}, which is not one of {a}, {b};"
        " write literal braces as {{ and }} (or not)"
    )


def test_broken_syntax_is_refused():
    with pytest.raises(ValueError, match=r"^k is not a valid template \("):
        template_fields("{unclosed", ("a",), "k")
