"""The quickstart plan and a tiny task set for runs on SmolLM2 that must finish in seconds."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PLAN = ROOT / "examples" / "quickstart" / "plan.toml"
TASKS = [
    {"id": f"easy-{a}-{b}", "question": f"What is {a} + {b}?", "answer": str(a + b)}
    for a, b in ((2, 0), (5, 0), (3, 0), (7, 0))
]


def write_tasks(folder: Path) -> tuple[Path, Path]:
    """The train split (:data:`TASKS`) and a one-task held-out split, as JSONL files."""
    tasks = folder / "easy.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    held_out = folder / "held-out.jsonl"
    held_out.write_text(json.dumps({"id": "h-1", "question": "What is 4 + 4?", "answer": "8"}))
    return tasks, held_out
