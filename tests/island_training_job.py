"""One trainer incarnation of ``test_trainer_role``'s run as a job of its own, for
``test_trainer_island_training.py``: ``python island_training_job.py ROOT MODEL LORA_JSON N``
builds that test's trainer role over the store under ROOT and runs incarnation N."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "core" / "tests")]

from test_trainer_role import trainer_role  # noqa: E402


def main() -> None:
    root, model, lora, incarnation = sys.argv[1:5]
    role, printed = trainer_role(Path(root), Path(model), json.loads(lora))
    role.island_incarnation = int(incarnation)
    try:
        result = asyncio.run(role.run())
    finally:
        role.c.trainer.close()
        print(printed.getvalue())
    print(f"incarnation {incarnation}: {result.status}")


if __name__ == "__main__":
    main()
