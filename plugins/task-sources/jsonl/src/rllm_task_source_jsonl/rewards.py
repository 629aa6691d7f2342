"""The reward functions of the jsonl task source, shared with other question/answer sources:
they live in :mod:`rllm_core.kit.answers` (see there for what each one compares)."""

from rllm_core.kit.answers import (
    REWARDS,
    Score,
    boxed_match,
    exact_match,
    find_numbers,
    last_boxed,
    numeric_match,
    parse_number,
)

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
