"""Write the shipped question/answer sets next to this script.

    python examples/tasks/make_arithmetic.py            # rewrite the files
    python examples/tasks/make_arithmetic.py --check    # exit 1 if a file differs

Outputs (one JSON object per line, keys ``id``, ``question``, ``answer`` and for the word
problems ``split``; ``answer`` is the result as a string of digits):

- ``arithmetic.jsonl``: the train split, 240 additions and subtractions drawn from every
  single-digit pair (``a + b`` and, with ``a >= b``, ``a - b``) and problems with a two-digit
  first operand.
- ``arithmetic-eval.jsonl``: the eval split, 60 problems of the same kinds, none of them in
  the train file.
- ``word-problems.jsonl``: 120 short stories around one addition or subtraction, with a
  ``split`` field (``train`` or ``eval``).

The output depends on nothing but this file: the order comes from SHA-256 of each question,
never from a random generator, so the files are byte-identical on every machine and Python
version. Results are never negative.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

TRAIN_SIZE = 240
EVAL_SIZE = 60
WORD_PROBLEMS = 120
WORD_EVAL_EVERY = 5  # every fifth word problem goes to the eval split

NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun")
THINGS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "cards")


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _question(a: int, op: str, b: int) -> dict[str, str]:
    value = a + b if op == "+" else a - b
    return {"question": f"What is {a} {op} {b}?", "answer": str(value)}


def arithmetic_pool() -> list[dict[str, str]]:
    """Every problem the two arithmetic files draw from, in a fixed pseudo-random order."""
    pool = []
    for a in range(10):
        for b in range(10):
            pool.append(_question(a, "+", b))
            if a >= b:
                pool.append(_question(a, "-", b))
    for a in range(10, 100, 7):
        for b in range(3, 100, 11):
            pool.append(_question(a, "+", b))
            if a >= b:
                pool.append(_question(a, "-", b))
    return sorted(pool, key=lambda row: _key(row["question"]))


def arithmetic_splits() -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    pool = arithmetic_pool()
    train = [{"id": f"arith-train-{i:03d}", **row} for i, row in enumerate(pool[:TRAIN_SIZE])]
    held_out = pool[TRAIN_SIZE : TRAIN_SIZE + EVAL_SIZE]
    evaluation = [{"id": f"arith-eval-{i:03d}", **row} for i, row in enumerate(held_out)]
    return train, evaluation


def _story(index: int) -> dict[str, str]:
    digest = hashlib.sha256(f"story-{index}".encode()).digest()
    name = NAMES[digest[0] % len(NAMES)]
    thing = THINGS[digest[1] % len(THINGS)]
    first = 2 + digest[2] % 40
    second = 1 + digest[3] % 20
    if index % 2 == 0:
        question = (
            f"{name} has {first} {thing}. {name} gets {second} more {thing}. "
            f"How many {thing} does {name} have now?"
        )
        answer = first + second
    else:
        first = max(first, second)
        question = (
            f"{name} has {first} {thing} and gives away {second} of them. "
            f"How many {thing} does {name} have left?"
        )
        answer = first - second
    return {"question": question, "answer": str(answer)}


def word_problems() -> list[dict[str, str]]:
    rows = []
    for index in range(WORD_PROBLEMS):
        split = "eval" if index % WORD_EVAL_EVERY == WORD_EVAL_EVERY - 1 else "train"
        rows.append({"id": f"word-{index:03d}", "split": split, **_story(index)})
    return rows


def render(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def outputs() -> dict[str, str]:
    """File name -> exact file text, for every file this script writes."""
    train, evaluation = arithmetic_splits()
    return {
        "arithmetic.jsonl": render(train),
        "arithmetic-eval.jsonl": render(evaluation),
        "word-problems.jsonl": render(word_problems()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write into")
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name, text in outputs().items():
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(
            f"out of date: {', '.join(stale)}; run python {Path(__file__).name} to regenerate",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
