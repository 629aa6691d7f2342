"""Command output as the model sees it: streams joined, long output cut in the middle."""

from __future__ import annotations

import pytest
from rllm_core.types import ExecResult
from rllm_harness_shell.observation import command_output, truncate_middle

MARKER = "\n[... {cut} characters cut ...]\n"
TEXT = "abcdefghij" * 3  # 30 characters


def test_output_that_fits_is_unchanged():
    assert truncate_middle(TEXT, 30, MARKER) == (TEXT, 0)
    assert truncate_middle("", 5, MARKER) == ("", 0)


def test_cut_output_keeps_head_and_tail_and_says_how_much_was_cut():
    assert truncate_middle(TEXT, 10, MARKER) == (
        "abcde\n[... 20 characters cut ...]\nfghij",
        20,
    )


def test_an_odd_budget_gives_the_head_the_extra_character():
    assert truncate_middle(TEXT, 7, MARKER) == ("abcd\n[... 23 characters cut ...]\nhij", 23)


def test_a_budget_of_one_keeps_only_the_first_character():
    assert truncate_middle(TEXT, 1, "<{cut}>") == ("a<29>", 29)


def test_a_budget_below_one_is_refused():
    with pytest.raises(ValueError, match="got 0"):
        truncate_middle(TEXT, 0, MARKER)


@pytest.mark.parametrize(
    ("stdout", "stderr", "joined"),
    [
        ("out\n", "", "out\n"),
        ("", "err\n", "err\n"),
        ("out\n", "err\n", "out\nerr\n"),
        ("out", "err", "out\nerr"),
    ],
)
def test_stdout_comes_before_stderr(stdout, stderr, joined):
    assert command_output(ExecResult(exit_code=0, stdout=stdout, stderr=stderr)) == joined
