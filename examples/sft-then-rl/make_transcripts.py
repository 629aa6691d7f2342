"""Write ``arithmetic-sft.jsonl``: a correct chat transcript for every quickstart training task.

    python examples/sft-then-rl/make_transcripts.py            # rewrite the file
    python examples/sft-then-rl/make_transcripts.py --check    # exit 1 if it differs

Each line is one conversation in the chat JSONL format of ``rllm-core sft`` (``messages``):
the system prompt and user message the quickstart's ``single-turn`` harness sends for a task
of ``../tasks/arithmetic.jsonl``, then the assistant's reply, the answer alone (``"28"``),
which the quickstart's ``numeric`` reward scores 1. Only the train split is used; the held-out
split (``arithmetic-eval.jsonl``) stays unseen.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
TASKS = HERE.parent / "tasks" / "arithmetic.jsonl"
OUTPUT = "arithmetic-sft.jsonl"
SYSTEM_PROMPT = "Answer with the number only."
"""The quickstart's ``[harness].system_prompt``; the transcripts must show the model the same
conversation it gets during RL and evaluation."""


def transcript(task: dict[str, str], system_prompt: str = SYSTEM_PROMPT) -> dict[str, object]:
    """The conversation of one ``{"id", "question", "answer"}`` task, answered correctly."""
    return {
        "id": task["id"],
        "messages": [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": task["question"]},
            {"role": "assistant", "content": task["answer"]},
        ],
    }


def read_tasks(path: Path = TASKS) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def render(rows: Iterable[dict[str, object]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def output_text(tasks_path: Path = TASKS) -> str:
    """The exact text of the file this script writes."""
    return render(transcript(task) for task in read_tasks(tasks_path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / OUTPUT, help="file to write")
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    text = output_text()
    if args.check:
        if not args.out.is_file() or args.out.read_text(encoding="utf-8") != text:
            print(
                f"out of date: {args.out}; run python {Path(__file__).name} to regenerate",
                file=sys.stderr,
            )
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
