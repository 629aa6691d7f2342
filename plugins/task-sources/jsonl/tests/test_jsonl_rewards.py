"""The reward functions: exact, numeric (with partial credit) and boxed, on hand-made replies."""

from __future__ import annotations

import pytest
from rllm_task_source_jsonl.rewards import (
    Score,
    boxed_match,
    exact_match,
    find_numbers,
    last_boxed,
    numeric_match,
    parse_number,
)


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("12", [12.0]),
        ("12.0", [12.0]),
        ("1,200 apples", [1200.0]),
        ("-3", [-3.0]),
        ("x=-3", [-3.0]),
        ("\u22124", [-4.0]),
        ("+5", [5.0]),
        ("7-3=4", [7.0, 3.0, 4.0]),
        ("23 - 8 = 15", [23.0, 8.0, 15.0]),
        ("12,5", [12.0, 5.0]),
        ("1,2345", [1.0, 2345.0]),
        ("H2O and 5", [5.0]),
        ("The answer is 12.", [12.0]),
        ("version 1.2.3", [1.2]),
        ("no digits here", []),
        ("\u0663", []),
    ],
)
def test_find_numbers(text, numbers):
    assert find_numbers(text) == numbers


@pytest.mark.parametrize(("text", "value"), [("12", 12.0), (" -3\n", -3.0), ("1,200", 1200.0)])
def test_parse_number_accepts_one_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "twelve", "12 apples", "1/2", "12."])
def test_parse_number_rejects_anything_else(text):
    with pytest.raises(ValueError, match="is not a number"):
        parse_number(text)


@pytest.mark.parametrize(
    ("reply", "answer", "expected"),
    [
        ("Paris", "Paris", Score(1.0, True)),
        ("  Paris\n", "Paris ", Score(1.0, True)),
        ("paris", "Paris", Score(0.0, True)),
        ("Paris, France", "Paris", Score(0.0, True)),
        ("   ", "Paris", Score(0.0, False)),
    ],
)
def test_exact_match(reply, answer, expected):
    assert exact_match(reply, answer) == expected


@pytest.mark.parametrize(
    ("reply", "answer", "expected"),
    [
        ("12", "12", Score(1.0, True)),
        ("12.0", "12", Score(1.0, True)),
        ("3 + 9 = 12", "12", Score(1.0, True)),
        ("1,200", "1200", Score(1.0, True)),
        ("-3", "-3", Score(1.0, True)),
        ("3", "-3", Score(0.0, True)),
        ("12. Then 3 more", "12", Score(0.0, True)),
        ("I do not know", "12", Score(0.0, False)),
        ("12.0000001", "12", Score(1.0, True)),
        ("12.001", "12", Score(0.0, True)),
    ],
)
def test_numeric_match_uses_the_last_number(reply, answer, expected):
    assert numeric_match(reply, answer) == expected


def test_numeric_partial_credit_for_the_first_number():
    assert numeric_match("12. Then 3 more", "12", first_number_credit=0.5) == Score(0.5, True)
    assert numeric_match("3 + 9 = 12", "12", first_number_credit=0.5) == Score(1.0, True)
    assert numeric_match("4 and 5", "12", first_number_credit=0.5) == Score(0.0, True)


def test_numeric_tolerance():
    assert numeric_match("0.33", "0.333", tolerance=0.01) == Score(1.0, True)
    assert numeric_match("0.3", "0.333", tolerance=0.01) == Score(0.0, True)


def test_numeric_rejects_an_answer_that_is_not_a_number():
    with pytest.raises(ValueError, match="'twelve' is not a number"):
        numeric_match("12", "twelve")


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (r"\boxed{12}", "12"),
        (r"first \boxed{4} then \boxed{12}", "12"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed {x^{2}}", "x^{2}"),
        (r"\boxed{4} and an open \boxed{12", "4"),
        (r"\boxed{", None),
        ("no box", None),
    ],
)
def test_last_boxed(text, content):
    assert last_boxed(text) == content


@pytest.mark.parametrize(
    ("reply", "answer", "expected"),
    [
        (r"so \boxed{12}", "12", Score(1.0, True)),
        (r"\boxed{12.0}", "12", Score(1.0, True)),
        (r"\boxed{ 1,200 }", "1200", Score(1.0, True)),
        (r"\boxed{4} no wait \boxed{12}", "12", Score(1.0, True)),
        (r"\boxed{12} no wait \boxed{4}", "12", Score(0.0, True)),
        (r"$\boxed{\dfrac{1}{2}}$", r"\frac{1}{2}", Score(1.0, True)),
        (r"\boxed{\frac{1}{ 2 }}", r"$\frac{1}{2}$", Score(1.0, True)),
        (r"\boxed{\frac{1}{3}}", r"\frac{1}{2}", Score(0.0, True)),
        ("12", "12", Score(0.0, False)),
    ],
)
def test_boxed_match(reply, answer, expected):
    assert boxed_match(reply, answer) == expected
