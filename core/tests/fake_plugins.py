"""Sources of fake plugin modules used by discovery and CLI tests."""

from __future__ import annotations


def loss_plugin(name: str, summary: str = "a fake loss") -> str:
    return f'''
from pydantic import BaseModel, ConfigDict

from rllm_core import ComponentSpec, hookimpl


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scale: float = 1.0


def build(config):
    return ("built", config.scale)


@hookimpl
def rllm_losses():
    yield ComponentSpec(
        kind="loss", name="{name}", factory=build, config=Config, summary="{summary}"
    )
'''


BROKEN_IMPORT = """
raise RuntimeError("this plugin is broken on purpose")
"""

MISSPELLED = """
from rllm_core import ComponentSpec, hookimpl


@hookimpl
def rllm_loses():
    yield ComponentSpec(kind="loss", name="misspelled", factory=print, summary="never seen")
"""

UNMARKED = """
from rllm_core import ComponentSpec


def rllm_losses():
    yield ComponentSpec(kind="loss", name="unmarked", factory=print, summary="never seen")
"""

WRONG_SPEC = """
from rllm_core import ComponentSpec, hookimpl


@hookimpl
def rllm_losses():
    yield ComponentSpec(
        kind="renderer", name="oops", factory=print, summary="a renderer in the loss hook"
    )
"""

RAISING_HOOK = """
from rllm_core import hookimpl


@hookimpl
def rllm_losses():
    raise ValueError("cannot list losses")
    yield
"""
