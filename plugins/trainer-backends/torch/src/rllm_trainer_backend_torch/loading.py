"""Build the policy: pick the device, seed the generators, load the model, add LoRA adapters."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import random
import sys

import torch
from rllm_core.errors import ComponentError
from rllm_core.models import resolve_model

from rllm_trainer_backend_torch.plugin import TorchBackendConfig

__all__ = [
    "DTYPES",
    "fix_mmap_threshold",
    "load_policy",
    "load_reference",
    "release_free_memory",
    "resolve_device",
    "seed_everything",
]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _config_error(message: str) -> ComponentError:
    return ComponentError(message, kind="trainer_backend", name="torch")


def seed_everything(seed: int) -> None:
    """Seed Python's and torch's global generators (every CUDA device's too).

    LoRA initialization and dropout draw from torch's global generator, so they follow."""
    random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(spec: str) -> torch.device:
    """``auto`` → ``cuda:0`` when CUDA is available, else ``cpu``; other values are checked."""
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise _config_error(
                f"device {spec!r} asks for CUDA, but torch {torch.__version__} sees no CUDA"
                " device; set device = 'auto' or 'cpu'"
            )
        index = device.index or 0
        count = torch.cuda.device_count()
        if index >= count:
            raise _config_error(
                f"device {spec!r} does not exist: {count} CUDA device(s) are visible"
                f" (cuda:0 .. cuda:{count - 1})"
            )
        return torch.device("cuda", index)
    return device


def load_policy(config: TorchBackendConfig, device: torch.device) -> torch.nn.Module:
    """Load ``config.model`` in ``config.dtype`` on ``device``, in eval mode.

    With ``lora.rank > 0`` the result is a peft model whose only trainable parameters are the
    adapters; with ``rank = 0`` every parameter of the plain model is trainable. Call
    :func:`seed_everything` first: adapter initialization draws from torch's generator.
    ``config.model`` is resolved with :func:`rllm_core.models.resolve_model`, whose
    ``ModelError`` subclasses say how to fix an unknown or uncached model.
    """
    from transformers import AutoModelForCausalLM

    folder = resolve_model(config.model)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise _config_error(f"could not load model {config.model!r} from {folder}: {exc}") from exc
    # Converting after loading gives the same weights whatever dtype the loader picked.
    model = model.to(device=device, dtype=DTYPES[config.dtype])
    if config.gradient_checkpointing:
        _enable_checkpointing(model)
    if config.lora.full:
        model.requires_grad_(True)
    else:
        model = _add_lora(model, config)
    model.eval()
    return model


def load_reference(config: TorchBackendConfig, device: torch.device) -> torch.nn.Module:
    """``config.model`` as :func:`load_policy` loads it before any adapter, frozen (no
    parameter requires grad) and in eval mode: the reference of ``[algorithm.kl]`` for full
    training, whose policy weights move away from it."""
    from transformers import AutoModelForCausalLM

    folder = resolve_model(config.model)
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    model = model.to(device=device, dtype=DTYPES[config.dtype])
    return model.requires_grad_(False).eval()


def _enable_checkpointing(model: torch.nn.Module) -> None:
    # transformers 5 renamed the method; older releases only have the first name.
    options = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


def _add_lora(model: torch.nn.Module, config: TorchBackendConfig) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    lora = config.lora
    targets = list(lora.target_modules)
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [target for target in targets if target not in names]
    if missing:
        linear = sorted(
            {
                name.rsplit(".", 1)[-1]
                for name, module in model.named_modules()
                if isinstance(module, torch.nn.Linear)
            }
        )
        raise _config_error(
            f"lora.target_modules names {missing} but model {config.model!r} has no such"
            f" module; its linear modules are: {', '.join(linear)}"
        )
    peft_config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_config)


def release_free_memory() -> None:
    """Hand the memory the C allocator holds free back to the system (glibc's
    ``malloc_trim``; nothing elsewhere).

    glibc keeps freed blocks for reuse, in one pool per thread that allocated them: what the
    sampler's thread freed stays resident while the trainer's thread allocates its own. It
    costs a few milliseconds; call it when a phase ends, not per tensor.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def fix_mmap_threshold(kib: int) -> None:
    """Make glibc map every host allocation of at least ``kib`` KiB on its own pages, so it
    goes back to the system when freed (``malloc_mmap_threshold_kb``).

    Raises :class:`~rllm_core.errors.ComponentError` where the C library has no such setting.
    """
    mallopt = _libc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    if mallopt is None or mallopt(_M_MMAP_THRESHOLD, kib * 1024) != 1:
        raise _config_error(
            f"malloc_mmap_threshold_kb = {kib}: this C library does not take an mmap threshold"
            " (only glibc on Linux does); remove the key from [trainer]"
        )


_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def _malloc_trim():
    return _libc_function("malloc_trim", (ctypes.c_size_t,))


@functools.cache
def _libc_function(name: str, argtypes: tuple) -> ctypes._CFuncPtr | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):  # musl and other C libraries lack glibc's extensions
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function
