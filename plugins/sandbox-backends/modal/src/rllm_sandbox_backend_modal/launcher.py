"""A :class:`~rllm_core.ports.TrainerLauncher` that runs each trainer incarnation in a Modal
sandbox: the trainer on its own island, on a Modal GPU.

A plan selects it with ``[scheduler].launcher = { name = "modal", image = "...", gpu = "A100" }``
(:class:`~rllm_sandbox_backend_modal.plugin.ModalLauncherConfig`).
``launch`` looks the app up (created when missing), creates a sandbox from ``image`` with
``gpu`` and the tags ``rllm-run`` and ``rllm-incarnation``, writes the command file's plan text
to ``plan_path`` inside it and runs ``rllm-core run <plan_path> --plain --role trainer
--incarnation N`` (with the command's ``--set`` items) there. The image must hold rllm-core,
the plan's plugins and the credentials of the run's object store (as Modal secrets), since the
job meets the scheduler only there. ``stop`` and ``release`` terminate the sandbox; the
polite stop is the scheduler's stop request in the object store. Every SDK call goes through
``client`` (the ``modal`` module unless a test passes a fake) and its ``.aio`` variants.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rllm_core.ports import ObjectStore
from rllm_core.training.island import CommandFile, TrainerJobError, read_command

if TYPE_CHECKING:
    from rllm_sandbox_backend_modal.plugin import ModalLauncherConfig

__all__ = ["ModalTrainerJob", "ModalTrainerLauncher"]


class ModalTrainerJob:
    """One incarnation's sandbox and the trainer process in it."""

    def __init__(self, sandbox: Any, process: Any) -> None:
        self.sandbox = sandbox
        self.job_id = f"modal sandbox {sandbox.object_id}"
        self._exit = asyncio.ensure_future(process.wait.aio())

    async def wait(self, timeout_s: float | None = None) -> int | None:
        await asyncio.sleep(0)
        done, _ = await asyncio.wait({self._exit}, timeout=timeout_s)
        return self._exit.result() if done else None

    async def stop(self, grace_s: float = 10.0) -> None:
        if await self.wait(grace_s) is None:
            await self.release()

    async def release(self) -> None:
        await self.sandbox.terminate.aio()
        if not self._exit.done():
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self._exit), 30)


class ModalTrainerLauncher:
    """Starts trainer incarnations in Modal sandboxes (the module docstring). ``timeout_s``
    bounds a sandbox's life (Modal's own limit applies); ``argv(command, plan_path)`` replaces
    the command line run in it."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        image: str,
        app_name: str = "rllm-trainers",
        gpu: str | None = None,
        environment_name: str | None = None,
        timeout_s: int = 24 * 3600,
        plan_path: str = "/tmp/rllm-trainer/plan.toml",
        argv: Callable[[CommandFile, str], Sequence[str]] | None = None,
        client: Any = None,
    ) -> None:
        self.store = store
        self.image = image
        self.app_name = app_name
        self.gpu = gpu
        self.environment_name = environment_name
        self.timeout_s = timeout_s
        self.plan_path = plan_path
        self.argv = argv or _trainer_argv
        self.modal = client if client is not None else _modal_module()

    @classmethod
    def from_config(cls, config: ModalLauncherConfig) -> ModalTrainerLauncher:
        """Build from the validated plan config (the component factory of
        ``[scheduler].launcher = { name = "modal", ... }``); the store is the run's
        ``[object_store]``."""
        if config.store is None:
            raise ValueError(
                "trainer_launcher:modal meets its jobs in the plan's [object_store]; add an"
                ' [object_store] section both the scheduler and Modal reach (name = "s3")'
            )
        return cls(
            config.store,
            image=config.image,
            app_name=config.app_name,
            gpu=config.gpu,
            environment_name=config.environment_name,
            timeout_s=config.timeout_s,
            plan_path=config.plan_path,
        )

    async def launch(self, incarnation: int, command_file_uri: str) -> ModalTrainerJob:
        command = await asyncio.to_thread(read_command, self.store, command_file_uri)
        if command.incarnation != incarnation:
            raise TrainerJobError(
                f"{command_file_uri!r} is the command of incarnation {command.incarnation},"
                f" not {incarnation}"
            )
        app = await self.modal.App.lookup.aio(
            self.app_name, environment_name=self.environment_name, create_if_missing=True
        )
        kwargs: dict[str, Any] = {
            "app": app,
            "image": self.modal.Image.from_registry(self.image),
            "timeout": self.timeout_s,
            "tags": {"rllm-run": command.run, "rllm-incarnation": str(incarnation)},
        }
        if self.gpu is not None:
            kwargs["gpu"] = self.gpu
        sandbox = await self.modal.Sandbox.create.aio(**kwargs)
        try:
            await sandbox.filesystem.write_bytes.aio(command.plan.encode(), self.plan_path)
            process = await sandbox.exec.aio(*self.argv(command, self.plan_path), text=False)
        except BaseException:
            await sandbox.terminate.aio()
            raise
        return ModalTrainerJob(sandbox, process)


def _modal_module() -> Any:
    import modal

    return modal


def _trainer_argv(command: CommandFile, plan_path: str) -> list[str]:
    argv = ["rllm-core", "run", plan_path, "--plain", "--role", command.role]
    argv += ["--incarnation", str(command.incarnation)]
    for item in command.overrides:
        argv += ["--set", item]
    return argv
