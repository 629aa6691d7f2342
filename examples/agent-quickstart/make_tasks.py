"""Write the agent quickstart's task sets and SFT transcripts next to this script.

    python examples/agent-quickstart/make_tasks.py            # rewrite them
    python examples/agent-quickstart/make_tasks.py --check    # exit 1 if anything differs

Every task is a Harbor task (``instruction.md``, ``task.toml``, ``environment/Dockerfile``,
``tests/test.sh``, ``solution/solve.sh``) whose answer is a number the agent can only learn by
looking inside the sandbox, and writes to ``/app/answer.txt``:

- ``find-code``: a four-digit access code sits in one file of a small tree under ``/data``,
  among files of other text (and, in harder instances, lines with other numbers);
- ``count-matches``: how many lines of a log under ``/data`` hold a given word;
- ``run-program``: what a script under ``/data/bin`` prints for a given argument.

Difficulty grows with the depth of the tree, the number of files and the distractors, so
early groups mix successes and failures. The reference solution takes two commands: one to
look, one to write the answer.

Outputs, each from a disjoint set of instances:

- ``tasks/train/``: the tasks RL trains on;
- ``tasks/held-out/``: the tasks ``rllm-core eval`` scores before and after;
- ``sft.jsonl``: chat transcripts of the ``shell`` harness solving yet other instances, for
  the SFT warm start (its default system prompt, a look, the observation, the answer, DONE).

The output depends on nothing but this file: instances come from SHA-256 of their index,
never from a random generator, so the files are byte-identical on every machine.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

TRAIN = 48
HELD_OUT = 32
SFT = 80

WORDS = ("alpha", "birch", "cedar", "delta", "ember", "fjord", "grove", "harbor", "iris", "juniper")
NOTES = (
    "remember to water the plants",
    "meeting moved to thursday",
    "buy more coffee filters",
    "the printer on floor two is broken",
    "backup finished without errors",
    "call the landlord about the heating",
)
LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")
EVENTS = ("disk check", "user login", "cache refresh", "job queued", "job done", "config load")

# A task's tests/ folder reaches the sandbox on its own, so each task holds its whole check,
# kept to four lines.
TEST_SH = """#!/bin/bash
# Verifier: reward 1 when /app/answer.txt holds {answer} (blanks ignored), else 0.
actual=$(tr -d ' \\t\\r\\n' < /app/answer.txt 2>/dev/null)
if [ "$actual" = "{answer}" ]; then echo PASS; reward=1
else echo "FAIL: /app/answer.txt holds '$actual', expected {answer}"; reward=0; fi
mkdir -p /logs/verifier && echo $reward > /logs/verifier/reward.txt; exit 0
"""

TASK_TOML = """version = "1.0"

[metadata]
difficulty = "{difficulty}"
category = "{kind}"
tags = ["agent-quickstart", "{kind}"]

[agent]
timeout_sec = 60.0

[verifier]
timeout_sec = 20.0

[environment]
cpus = 1
memory_mb = 256
storage_mb = 256
allow_internet = false
"""


@dataclass
class Instance:
    """One task: what the agent reads, the files it finds, the commands that solve it."""

    kind: str
    difficulty: str
    instruction: str
    files: dict[str, str]
    look: str
    answer: str
    executables: list[str] = field(default_factory=list)

    def dockerfile(self) -> str:
        lines = ["FROM debian:bookworm-slim", "WORKDIR /app"]
        for path, text in self.files.items():
            folder = path.rsplit("/", 1)[0]
            lines.append(f"RUN mkdir -p {folder} && printf {_printf(text)} > {path}")
        for path in self.executables:
            lines.append(f"RUN chmod +x {path}")
        return "\n".join(lines) + "\n"

    def observation(self) -> str:
        """What ``look`` prints in the sandbox (the reference transcripts show it)."""
        if self.kind == "find-code":
            return "\n".join(
                f"{path}:{line}"
                for path, text in self.files.items()
                for line in text.splitlines()
                if "code" in line
            )
        return self.answer


def _printf(text: str) -> str:
    """``text`` as printf's format, one single-quoted word on one line: the generated texts
    hold no quote, percent sign or backslash, and newlines become ``\\n``."""
    assert not set(text) & set("'%\\"), text
    return "'" + text.replace("\n", "\\n") + "'"


class Draw:
    """Deterministic choices for instance ``index`` of ``split``."""

    def __init__(self, split: str, index: int) -> None:
        self._seed = f"{split}:{index}"
        self._counter = 0

    def number(self, low: int, high: int) -> int:
        self._counter += 1
        digest = hashlib.sha256(f"{self._seed}:{self._counter}".encode()).digest()
        return low + int.from_bytes(digest[:8], "big") % (high - low + 1)

    def pick(self, items: tuple[str, ...] | list[str]) -> str:
        return items[self.number(0, len(items) - 1)]


def find_code(draw: Draw) -> Instance:
    level = draw.number(0, 2)
    code = str(draw.number(1000, 9999))
    depth = level
    folders = ["/data"]
    for _ in range(depth):
        folders.append(f"{folders[-1]}/{draw.pick(WORDS)}")
    files: dict[str, str] = {}
    for n in range(2 + 2 * level):
        folder = folders[draw.number(0, len(folders) - 1)]
        lines = [draw.pick(NOTES) for _ in range(draw.number(1, 3))]
        if level == 2:
            lines.append(f"room {draw.number(100, 999)}")
        files[f"{folder}/{draw.pick(WORDS)}-{n}.txt"] = "\n".join(lines) + "\n"
    secret = f"{folders[-1]}/{draw.pick(WORDS)}-code.txt"
    files[secret] = f"{draw.pick(NOTES)}\naccess code: {code}\n"
    files = dict(sorted(files.items()))
    return Instance(
        kind="find-code",
        difficulty=("easy", "medium", "hard")[level],
        instruction=(
            "An access code (four digits) is written in one of the files under `/data`. Find"
            " it and write the code, digits only, to `/app/answer.txt`."
        ),
        files=files,
        look="grep -r code /data",
        answer=code,
    )


def count_matches(draw: Draw) -> Instance:
    level = draw.pick(LEVELS[:3])
    lines = [
        f"{draw.pick(LEVELS)} {draw.pick(EVENTS)} #{draw.number(1, 99)}"
        for _ in range(draw.number(6, 14))
    ]
    count = sum(1 for line in lines if line.split()[0] == level)
    if count == 0:
        lines[draw.number(0, len(lines) - 1)] = f"{level} {draw.pick(EVENTS)} #1"
        count = sum(1 for line in lines if line.split()[0] == level)
    name = f"/data/{draw.pick(WORDS)}.log"
    return Instance(
        kind="count-matches",
        difficulty="medium",
        instruction=(
            f"The log `{name}` has one event per line. Count the lines that contain {level}"
            " and write the number, digits only, to `/app/answer.txt`."
        ),
        files={name: "\n".join(lines) + "\n"},
        look=f"grep -c {level} {name}",
        answer=str(count),
    )


def run_program(draw: Draw) -> Instance:
    factor, offset = draw.number(2, 9), draw.number(1, 50)
    argument = draw.number(2, 30)
    name = f"/data/bin/{draw.pick(WORDS)}"
    script = f"#!/bin/bash\necho $(( $1 * {factor} + {offset} ))\n"
    return Instance(
        kind="run-program",
        difficulty="easy",
        instruction=(
            f"Run the program `{name}` with the argument {argument} and write what it prints,"
            " digits only, to `/app/answer.txt`."
        ),
        files={name: script},
        look=f"{name} {argument}",
        answer=str(argument * factor + offset),
        executables=[name],
    )


KINDS = (find_code, find_code, count_matches, run_program)


def instances(split: str, count: int) -> Iterator[tuple[str, Instance]]:
    for index in range(count):
        draw = Draw(split, index)
        instance = KINDS[index % len(KINDS)](draw)
        yield f"{instance.kind}-{split}-{index:03d}", instance


def write_task(folder: Path, task_id: str, instance: Instance) -> None:
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "solution").mkdir()
    (folder / "instruction.md").write_text(instance.instruction + "\n")
    (folder / "task.toml").write_text(
        TASK_TOML.format(difficulty=instance.difficulty, kind=instance.kind)
    )
    (folder / "environment" / "Dockerfile").write_text(instance.dockerfile())
    (folder / "tests" / "test.sh").write_text(TEST_SH.format(answer=instance.answer))
    (folder / "solution" / "solve.sh").write_text(
        f"#!/bin/bash\n# Reference solution of {task_id}.\nset -euo pipefail\n"
        f"{instance.look}\necho {instance.answer} > /app/answer.txt\n"
    )


def transcript(task_id: str, instance: Instance) -> dict[str, object]:
    """The ``shell`` harness's conversation solving ``instance`` in two commands."""
    from rllm_harness_shell.plugin import ShellConfig

    config = ShellConfig()
    assert config.system_prompt is not None
    system = config.system_prompt.format(
        workdir="/app", done_marker=config.done_marker, max_turns=4, command_timeout_s=10.0
    )

    def observe(output: str) -> str:
        return config.observation_template.format(
            exit_code=0, output=output or config.empty_output, command=""
        )

    write = f"echo {instance.answer} > /app/answer.txt"
    return {
        "id": task_id,
        "messages": [
            {"role": "system", "content": system},
            {
                "role": "user",
                "content": config.instruction_template.format(
                    instruction=instance.instruction, task_id=task_id, workdir="/app"
                ),
            },
            {"role": "assistant", "content": f"```bash\n{instance.look}\n```"},
            {"role": "user", "content": observe(instance.observation() + "\n")},
            {"role": "assistant", "content": f"```bash\n{write}\n```"},
            {"role": "user", "content": observe("")},
            {"role": "assistant", "content": config.done_marker},
        ],
    }


def write_all(root: Path) -> None:
    for split, count in (("train", TRAIN), ("held-out", HELD_OUT)):
        for task_id, instance in instances(split, count):
            write_task(root / "tasks" / split / task_id, task_id, instance)
    rows = [transcript(task_id, instance) for task_id, instance in instances("sft", SFT)]
    (root / "sft.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def same_tree(a: Path, b: Path) -> bool:
    compared = filecmp.dircmp(a, b)
    if compared.left_only or compared.right_only or compared.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, compared.common_files, shallow=False)
    if mismatch or errors:
        return False
    return all(same_tree(a / name, b / name) for name in compared.common_dirs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch)
        write_all(fresh)
        if args.check:
            same = (
                same_tree(fresh / "tasks", HERE / "tasks") if (HERE / "tasks").is_dir() else False
            )
            same = same and filecmp.cmp(fresh / "sft.jsonl", HERE / "sft.jsonl", shallow=False)
            if not same:
                print("out of date: run python examples/agent-quickstart/make_tasks.py")
                return 1
            return 0
        shutil.rmtree(HERE / "tasks", ignore_errors=True)
        shutil.copytree(fresh / "tasks", HERE / "tasks")
        shutil.copyfile(fresh / "sft.jsonl", HERE / "sft.jsonl")
    print(f"wrote {TRAIN} train and {HELD_OUT} held-out tasks, {SFT} SFT transcripts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
