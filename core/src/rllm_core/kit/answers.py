"""Reward functions that compare a model's reply with a task's expected answer: the
``exact``, ``numeric`` and ``boxed`` rewards of question/answer task sources
(:mod:`rllm_core.kit.qa_tasks`).

Each function takes the reply text and the expected answer and returns a :class:`Score`: the
reward in ``[0, 1]`` and whether the reply held something to compare at all (a number, a
``\\boxed{}``), which the task source reports as the ``parsed`` signal.

``exact``
    Leading and trailing whitespace of both sides is removed; the rest must be equal,
    character for character. Case counts: ``"Paris"`` does not match ``"paris"``.

``numeric``
    The reply's **last** number is compared with the answer: equal within ``tolerance``
    (absolute) gives 1.0. When it is not, and ``first_number_credit`` is above 0, a reply whose
    **first** number equals the answer gets that partial credit (a reply like ``"7. Next
    question: 5"`` found the answer but kept talking). No number in the reply gives 0.
    Numbers are written in the ASCII digits: an optional sign (``-``, ``+`` or U+2212, the
    minus sign) directly in front of the digits and not right after a letter or digit (``7-3``
    is 7 and 3, ``x=-3`` is -3), digits with optional thousands separators in groups of three
    (``1,200`` is 1200; ``12,5`` is 12 and 5) and an optional decimal part (``12.0``). A run
    of digits glued to a letter before it (``H2O``) is not a number. The answer must be one
    such number.

``boxed``
    The content of the reply's **last** complete ``\\boxed{...}`` (braces nested to any depth;
    an unclosed box does not count) is compared with the answer. Both sides are normalized:
    surrounding ``$`` removed, all whitespace removed, ``\\dfrac`` and ``\\tfrac`` read as
    ``\\frac``. When both normalized sides are numbers (the ``numeric`` grammar) they are
    compared within ``tolerance``; otherwise the normalized strings must be equal.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import NamedTuple

__all__ = [
    "REWARDS",
    "Score",
    "boxed_match",
    "exact_match",
    "find_numbers",
    "last_boxed",
    "numeric_match",
    "parse_number",
]


class Score(NamedTuple):
    """A reward and whether the reply held something the reward function could compare."""

    reward: float
    parsed: bool


_NUMBER = re.compile(
    r"(?<![A-Za-z0-9_.])"
    r"(?P<sign>[-+\u2212](?=[0-9]))?"
    r"(?P<int>[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)"
    r"(?P<frac>\.[0-9]+)?"
)


def _to_float(match: re.Match[str]) -> float:
    sign = -1.0 if match.group("sign") in ("-", "\u2212") else 1.0
    digits = match.group("int").replace(",", "") + (match.group("frac") or "")
    return sign * float(digits)


def find_numbers(text: str) -> list[float]:
    """Every number in ``text``, in order of appearance (grammar in the module docstring)."""
    return [_to_float(match) for match in _NUMBER.finditer(text)]


def parse_number(text: str) -> float:
    """``text`` as one number (surrounding whitespace allowed); ``ValueError`` otherwise."""
    stripped = text.strip()
    match = _NUMBER.fullmatch(stripped)
    if match is None:
        raise ValueError(f"{text!r} is not a number such as 12, -3, 12.5 or 1,200")
    return _to_float(match)


def _close(a: float, b: float, tolerance: float) -> bool:
    return math.isclose(a, b, rel_tol=0.0, abs_tol=tolerance)


def exact_match(reply: str, answer: str) -> Score:
    """1.0 when ``reply`` equals ``answer`` after stripping surrounding whitespace."""
    stripped = reply.strip()
    return Score(1.0 if stripped == answer.strip() else 0.0, bool(stripped))


def numeric_match(
    reply: str, answer: str, *, tolerance: float = 1e-6, first_number_credit: float = 0.0
) -> Score:
    """1.0 when the reply's last number equals ``answer`` within ``tolerance``;
    ``first_number_credit`` when only its first number does; else 0.0."""
    expected = parse_number(answer)
    numbers = find_numbers(reply)
    if not numbers:
        return Score(0.0, False)
    if _close(numbers[-1], expected, tolerance):
        return Score(1.0, True)
    if first_number_credit > 0.0 and _close(numbers[0], expected, tolerance):
        return Score(first_number_credit, True)
    return Score(0.0, True)


_BOX_OPEN = re.compile(r"\\boxed\s*\{")


def last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` in ``text``, or ``None``."""
    found = None
    for opening in _BOX_OPEN.finditer(text):
        depth = 1
        for index in range(opening.end(), len(text)):
            char = text[index]
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    found = text[opening.end() : index]
                    break
    return found


_WHITESPACE = re.compile(r"\s+")


def _normalize_math(text: str) -> str:
    text = text.strip().strip("$")
    text = _WHITESPACE.sub("", text)
    return text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def boxed_match(reply: str, answer: str, *, tolerance: float = 1e-6) -> Score:
    """1.0 when the last ``\\boxed{}`` of the reply matches ``answer`` (see the module doc)."""
    content = last_boxed(reply)
    if content is None:
        return Score(0.0, False)
    got, want = _normalize_math(content), _normalize_math(answer)
    try:
        same = _close(parse_number(got), parse_number(want), tolerance)
    except ValueError:
        same = got == want
    return Score(1.0 if same else 0.0, True)


REWARDS: dict[str, Callable[..., Score]] = {
    "exact": exact_match,
    "numeric": numeric_match,
    "boxed": boxed_match,
}
