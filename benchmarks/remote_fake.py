"""A stand-in for a remote trainer and sampler (Tinker-like call latency), for benchmarks.

``trainer_backend:remote-fake`` trains nothing and computes nothing: every call waits as long
as a hosted training service takes to answer it, without using the CPU, so a benchmark
measures how the run loop overlaps remote calls, not how fast this machine does arithmetic.

- ``forward_backward`` waits ``forward_backward_s`` plus ``forward_backward_token_ms`` per
  token of the datums; ``optim_step`` waits ``optim_step_s`` and publishes the next weight
  version. Both run on the loop's trainer thread, so they wait with ``time.sleep``.
- The sampler serves ``sampler_slots`` requests at a time (the rest queue, as on a busy
  service); each waits ``sample_s`` plus ``sample_token_ms`` per completion token
  (``asyncio.sleep``) and reports the weight version it started generating with.
- The policy is scripted and needs no model: it reads an arithmetic question ("What is
  31 - 3?", as in ``examples/tasks/arithmetic.jsonl``) from the decoded prompt and answers it
  correctly with probability ``accuracy_start + accuracy_gain * version`` (at most
  ``accuracy_max``), otherwise with a wrong number; prompts without such a question get "42".
  Replies are encoded with the tokenizer of ``model`` (only its ``tokenizer.json`` is read),
  whose folder is also the chat renderer's default tokenizer. Reward therefore rises with
  the version a sample was taken with, not with what was trained: the curve shows what
  sampling on older versions costs, not a learning algorithm.

Run ``rllm-core`` with the backend registered in-process (same arguments as ``rllm-core``)::

    .venv/bin/python benchmarks/remote_fake.py plan check PLAN
    .venv/bin/python benchmarks/remote_fake.py run PLAN --plain

``[trainer] name = "remote-fake"`` selects it; every config key below has a default.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, hookimpl
from rllm_core.types import Datum, SampleRequest, SampleResult

NAME = "remote-fake"
DISTRIBUTION = "rllm-benchmarks"
_QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


class RemoteFakeConfig(BaseModel):
    """Keys of ``[trainer] name = "remote-fake"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        default="smollm2-135m-instruct",
        description="catalog name or model folder whose tokenizer.json encodes replies (no"
        " weights are loaded); a plan's renderer takes its tokenizer from the same folder",
    )
    forward_backward_s: float = Field(default=1.5, ge=0, description="wait per forward_backward")
    forward_backward_token_ms: float = Field(
        default=0.02, ge=0, description="more wait per datum token, in ms"
    )
    optim_step_s: float = Field(default=0.5, ge=0, description="wait per optim_step")
    sample_s: float = Field(default=0.3, ge=0, description="wait per sample call")
    sample_token_ms: float = Field(
        default=15.0, ge=0, description="more wait per completion token, in ms"
    )
    sampler_slots: int = Field(
        default=8, gt=0, description="sample calls served at once; more wait for a slot"
    )
    accuracy_start: float = Field(
        default=0.2, ge=0, le=1, description="share of questions answered right at version 0"
    )
    accuracy_gain: float = Field(default=0.08, ge=0, description="more of them per version")
    accuracy_max: float = Field(default=0.95, ge=0, le=1, description="the share at most")


class RemoteFakeSampler:
    """The sampler of :class:`RemoteFakeBackend`; see the module docstring."""

    def __init__(self, backend: RemoteFakeBackend, tokenizer: Any) -> None:
        self._backend = backend
        self._tokenizer = tokenizer
        self._config = backend.config
        self._slots: asyncio.Semaphore | None = None
        self._active = 0
        self._busy_since = 0.0
        self._busy_s = 0.0

    @property
    def weight_version(self) -> int:
        return self._backend.weight_version

    @property
    def busy_seconds(self) -> float:
        """Seconds during which at least one call was generating (``BusyClock``)."""
        if self._active:
            return self._busy_s + time.monotonic() - self._busy_since
        return self._busy_s

    def accuracy(self, version: int) -> float:
        config = self._config
        return min(config.accuracy_max, config.accuracy_start + config.accuracy_gain * version)

    def reply(self, request: SampleRequest, version: int) -> str:
        """The scripted policy's answer to ``request`` under weight ``version``."""
        prompt = self._tokenizer.decode(request.prompt_token_ids, skip_special_tokens=False)
        found = _QUESTION.findall(prompt)
        if not found:
            return "42"
        left, op, right = found[-1]
        answer = {"+": int(left) + int(right), "-": int(left) - int(right)}.get(
            op, int(left) * int(right)
        )
        key = f"{request.params.seed}|{request.request_id}|{request.prompt_token_ids}|{version}"
        rng = random.Random(key)
        if rng.random() < self.accuracy(version):
            return str(answer)
        return str(answer + rng.choice([-10, -3, -2, -1, 1, 2, 3, 10]))

    async def sample(self, request: SampleRequest) -> SampleResult:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._config.sampler_slots)
        async with self._slots:
            version = self._backend.weight_version
            if self._active == 0:
                self._busy_since = time.monotonic()
            self._active += 1
            try:
                text = self.reply(request, version)
                stops = request.params.stop_token_ids
                ids = list(self._tokenizer.encode(text, add_special_tokens=False).ids)
                ids = [*ids, stops[0]] if stops else ids
                limit = max(request.params.max_tokens, 0)
                reason = "stop" if stops and len(ids) <= limit else "length"
                ids = ids[:limit]
                config = self._config
                await asyncio.sleep(config.sample_s + config.sample_token_ms * len(ids) / 1000)
            finally:
                self._active -= 1
                if self._active == 0:
                    self._busy_s += time.monotonic() - self._busy_since
        share = math.log(max(self.accuracy(version), 1e-3)) / max(len(ids), 1)
        return SampleResult(
            completion_token_ids=ids,
            logprobs=[share] * len(ids),
            finish_reason=reason,
            weight_version=version,
        )


class RemoteFakeBackend:
    """A trainer backend that only waits; see the module docstring."""

    def __init__(self, config: RemoteFakeConfig | None = None) -> None:
        from rllm_core.models import resolve_model
        from tokenizers import Tokenizer

        self.config = config or RemoteFakeConfig()
        folder = Path(self.config.model)
        if not (folder / "tokenizer.json").is_file():
            folder = Path(resolve_model(self.config.model))
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._version = 0
        self._lock = threading.Lock()
        self._sampler = RemoteFakeSampler(self, self._tokenizer)
        self.calls = {"forward_backward": 0, "optim_step": 0}

    @property
    def weight_version(self) -> int:
        with self._lock:
            return self._version

    def sampler(self) -> RemoteFakeSampler:
        return self._sampler

    def forward_backward(self, datums: Sequence[Datum], objective: Any) -> Mapping[str, float]:
        tokens = sum(len(d.token_ids) for d in datums)
        actions = sum(sum(d.action_mask) for d in datums)
        config = self.config
        time.sleep(config.forward_backward_s + config.forward_backward_token_ms * tokens / 1000)
        self.calls["forward_backward"] += 1
        return {
            "loss": 0.0,
            "tokens": float(tokens),
            "sequences": float(len(datums)),
            "action_tokens": float(actions),
        }

    def optim_step(self) -> Mapping[str, float]:
        time.sleep(self.config.optim_step_s)
        with self._lock:
            self._version += 1
            version = self._version
        self.calls["optim_step"] += 1
        return {"step": float(version)}

    def save_state(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "remote-fake.json").write_text(
            json.dumps({"weight_version": self.weight_version})
        )

    def load_state(self, path: str) -> None:
        state = json.loads((Path(path) / "remote-fake.json").read_text())
        with self._lock:
            self._version = int(state["weight_version"])

    def close(self) -> None:
        """Nothing to release: the fake holds no connection."""


@hookimpl
def rllm_trainer_backends() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="trainer_backend",
        name=NAME,
        factory=RemoteFakeBackend,
        config=RemoteFakeConfig,
        summary="benchmarks only: waits like a remote trainer and sampler, trains nothing",
        traits={"publishes_weights": True},
    )


def register() -> None:
    """Register ``trainer_backend:remote-fake`` with this process's plugin manager."""
    from rllm_core.plugins.manager import get_plugin_manager

    get_plugin_manager().register(
        sys.modules[__name__], name=NAME, distribution=DISTRIBUTION, version="0+benchmark"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``rllm-core`` with the backend registered; exits as the command does."""
    from rllm_core.cli import main as cli

    register()
    cli.main(args=list(sys.argv[1:] if argv is None else argv), prog_name="rllm-core")


if __name__ == "__main__":
    main()
