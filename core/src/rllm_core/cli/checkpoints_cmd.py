"""``rllm-core checkpoints``: a run's checkpoints as folders other tools load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from rllm_core.cli.output import EXIT_FAILURE, EXIT_USAGE, err_console, fail


@click.group()
def checkpoints() -> None:
    """A run's checkpoints: export them for model servers, transformers and peft."""


@checkpoints.command("export")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="The folder to write; it must not exist yet, or be empty.",
)
@click.option(
    "--merge",
    is_flag=True,
    help="With LoRA, merge the adapters into the base weights and write a model folder.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def export_command(checkpoint: Path, out: Path, merge: bool, as_json: bool) -> None:
    """Export CHECKPOINT (a run folder for its latest checkpoint, or a checkpoint folder of a
    run: checkpoints/objects/cuts/<cut>) into DIR.

    The run's trainer backend is built from the run's saved plan, in this one process, and
    loads the checkpoint; it then writes its policy as its export_weights does: with LoRA a
    PEFT adapter folder (with the tokenizer), with --merge (or after full training) a model
    folder holding the tokenizer and chat template that loads on its own. Exit 2 when
    CHECKPOINT is no checkpoint of a run folder, DIR is not empty or the backend cannot export;
    1 when building the backend, loading or exporting fails.
    """
    from rllm_core.evaluation import CheckpointNotFound, checkpoint_state_dir
    from rllm_core.run.checkpoints import CHECKPOINT_FOLDERS, checkpoint_folder, run_folder_of

    checkpoint = checkpoint_folder(checkpoint)
    try:
        state_dir = checkpoint_state_dir(checkpoint)
    except CheckpointNotFound as exc:
        fail(str(exc), EXIT_USAGE)
    found = run_folder_of(checkpoint)
    if found is None:
        fail(
            f"{str(checkpoint)!r} is not inside a run folder (no folder above it has a"
            f" plan.resolved.json); pass a checkpoint folder where the run left it"
            f" ({CHECKPOINT_FOLDERS})",
            EXIT_USAGE,
        )
    run_dir = found
    resolved_file = run_dir / "plan.resolved.json"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        fail(
            f"--out {str(out)!r} already exists and is not an empty folder; name a new folder"
            " (or remove that one)",
            EXIT_USAGE,
        )
    trainer = _build_trainer(resolved_file, run_dir)
    try:
        try:
            trainer.load_state(str(state_dir))
        except Exception as exc:
            fail(
                f"cannot load checkpoint {str(checkpoint)!r}: {type(exc).__name__}: {exc}",
                EXIT_FAILURE,
            )
        try:
            exported = trainer.export_weights(str(out), merge=merge)
        except Exception as exc:
            fail(f"exporting {str(checkpoint)!r} into {str(out)!r} failed: {exc}", EXIT_FAILURE)
    finally:
        closer = getattr(trainer, "close", None)
        if callable(closer):
            closer()
    record = {
        "path": exported.path,
        "kind": exported.kind,
        "version": exported.version,
        "base_model": exported.base_model,
        "lora_rank": exported.lora_rank,
    }
    if as_json:
        click.echo(json.dumps(record))
        return
    what = "PEFT adapter folder" if exported.kind == "lora" else "model folder"
    click.echo(f"wrote {what} {exported.path} (weight version {exported.version})")
    if exported.kind == "lora":
        click.echo(f"base model: {exported.base_model} (LoRA rank {exported.lora_rank})")


def _build_trainer(resolved_file: Path, run_dir: Path) -> Any:
    """The run's trainer backend, built in this process from its resolved ``[trainer]``."""
    from rllm_core.errors import RllmError
    from rllm_core.plugins.manager import get_plugin_manager
    from rllm_core.plugins.specs import Kind
    from rllm_core.ports import ParallelSettings, WeightExporter

    resolved = json.loads(resolved_file.read_text(encoding="utf-8"))
    entry = next((c for c in resolved.get("components", []) if c.get("where") == "[trainer]"), None)
    if entry is None:
        fail(f"the run in {run_dir} has no [trainer] in {resolved_file.name}", EXIT_USAGE)
    name = entry["name"]
    try:
        spec = get_plugin_manager().get_record(Kind.TRAINER_BACKEND, name).spec
    except RllmError as exc:
        fail(f"the run's trainer backend cannot be built here: {exc}", EXIT_FAILURE)
    refusal = (
        f"the run's trainer backend {name!r} ([trainer] of {resolved_file}) does not export"
        " weights (WeightExporter); export with that backend's own tools, or train with one"
        " that does, such as 'torch'"
    )
    if not spec.trait("exports_weights"):
        fail(refusal, EXIT_USAGE)
    try:
        config = spec.validate_config(entry.get("config", {}))
    except Exception as exc:
        fail(f"the run's [trainer] config no longer validates: {exc}", EXIT_FAILURE)
    parallel = getattr(config, "parallel", None)
    if isinstance(parallel, ParallelSettings) and parallel.world_size > 1:
        # Exporting needs the whole weights, which one process holds after loading.
        config = config.model_copy(
            update={"parallel": parallel.model_copy(update={"world_size": 1})}
        )
    err_console.print(f"building trainer backend {name!r} to load the checkpoint", markup=False)
    try:
        trainer = spec.build(config)
    except Exception as exc:
        fail(f"building trainer backend {name!r} failed: {exc}", EXIT_FAILURE)
    if not isinstance(trainer, WeightExporter):
        closer = getattr(trainer, "close", None)
        if callable(closer):
            closer()
        fail(refusal, EXIT_USAGE)
    return trainer
