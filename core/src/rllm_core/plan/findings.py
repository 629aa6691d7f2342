"""What ``rllm-core plan check`` finds that a run would hit, without running it.

A resolved plan is valid; this looks past it, at the machine: every file and folder a
component's config names exists with the shape its config declares
(:class:`~rllm_core.plugins.specs.PlanPath` ``expects``), every model and tokenizer resolves
as the run resolves it (:func:`~rllm_core.models.resolve_model`), and every credential a
component declares (:class:`~rllm_core.plugins.specs.Credential`) is in the environment.

Findings are :class:`~rllm_core.errors.PlanIssue` records, each naming the file, the section
and the key. An error is what fails a run for sure (a missing data file, a folder without a
tokenizer); a warning is what the user may still fix before it (a model not pulled yet, whose
``rllm-core models pull`` command it names; a credential to export; a folder another plan's
``[sft].export`` or ``[run].export`` writes; a plan note). ``--strict`` makes every warning an
error.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any

from pydantic import BaseModel

from rllm_core.errors import ModelError, ModelNotCachedError, PlanError, PlanIssue
from rllm_core.plan.load import read_plan_file
from rllm_core.plan.resolve import ResolvedComponent, ResolvedPlan
from rllm_core.plan.teacher import teacher_issues
from rllm_core.plugins.specs import Credential, PlanPath

__all__ = ["Findings", "find_problems", "note_issue"]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_NOTE = re.compile(
    r"^\[(?P<section>[^\]]+(?:\[\d+\])?)\](?:\.(?P<key>[\w.\[\]]+?))?(?:: | )(?P<rest>.*)$", re.S
)
_WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "*.gguf")


@dataclass(frozen=True)
class Findings:
    """What :func:`find_problems` found: ``errors`` fail a run, ``warnings`` may."""

    errors: tuple[PlanIssue, ...] = ()
    warnings: tuple[PlanIssue, ...] = ()

    def strict(self) -> Findings:
        """Every warning made an error."""
        return Findings(errors=(*self.errors, *self.warnings))


def find_problems(resolved: ResolvedPlan, *, environ: Mapping[str, str] | None = None) -> Findings:
    """Every path, model and credential problem of ``resolved``'s components, and its notes
    as warnings (see the module docstring). Nothing is downloaded or built."""
    check = _Check(resolved, os.environ if environ is None else environ)
    for component in resolved:
        check.component(component)
    check.errors.extend(teacher_issues(resolved))
    for note in resolved.notes:
        check.warnings.append(note_issue(note, resolved.path))
    return Findings(errors=tuple(check.errors), warnings=tuple(check.warnings))


def note_issue(note: str, path: str) -> PlanIssue:
    """A plan note (``"<file>: [section].key: message"``) as a located issue."""
    text = note.removeprefix(f"{path}: ")
    match = _NOTE.match(text)
    if match is None:
        return PlanIssue(path=path, section="", key=None, message=text)
    return PlanIssue(path=path, section=match["section"], key=match["key"], message=match["rest"])


class _Check:
    def __init__(self, resolved: ResolvedPlan, environ: Mapping[str, str]) -> None:
        self.resolved = resolved
        self.environ = environ
        self.folder = Path(resolved.path).absolute().parent
        self.errors: list[PlanIssue] = []
        self.warnings: list[PlanIssue] = []
        self.reported: set[str] = set()
        try:
            self.raw: dict[str, Any] = read_plan_file(resolved.path)
        except PlanError:
            self.raw = {}

    def component(self, component: ResolvedComponent) -> None:
        section, base = _location(component.where)
        filled = set(component.spec.traits.get("run_keys", ()))
        for key, value, marker in _marked(type(component.config), component.config, base):
            if key.rsplit(".", 1)[-1] in filled and _lookup(self.raw, section, key) is None:
                continue  # the run wrote it from a key that is checked where the plan has it
            self.path(section, key, value, marker)
        for credential in component.spec.credentials:
            if credential.missing(component.config, self.environ):
                self.credential(component, section, base, credential)

    # ------------------------------------------------------------------ paths

    def add(self, level: str, section: str, key: str, message: str, hint: str | None) -> None:
        issue = PlanIssue(
            path=self.resolved.path, section=section, key=key, message=message, hint=hint
        )
        (self.errors if level == "error" else self.warnings).append(issue)

    def shown(self, section: str, key: str, value: str) -> str:
        """``value`` as the plan wrote it, with where it resolved to when that differs."""
        written = _lookup(self.raw, section, key)
        if (
            isinstance(written, str)
            and written != value
            and os.path.normpath(os.path.join(self.folder, written)) == os.path.normpath(value)
        ):
            return f"{written!r} (resolved to {value})"
        return repr(value)  # as written, or given with --set

    def path(self, section: str, key: str, value: str, marker: PlanPath) -> None:
        expects = marker.expects
        if expects in ("model", "tokenizer"):
            self.model(section, key, value, expects)
            return
        path = Path(value).expanduser()
        shown = self.shown(section, key, value)
        hint = "check the path (a relative path is read from the plan's folder)"
        if not path.exists():
            what = {"file": "file", "dir": "folder"}.get(expects or "", "file or folder")
            self.add("error", section, key, f"{shown}: no such {what}", hint)
        elif expects == "file" and not path.is_file():
            self.add("error", section, key, f"{shown} is a folder, not a file", hint)
        elif expects == "dir" and not path.is_dir():
            self.add("error", section, key, f"{shown} is a file, not a folder", hint)
        elif expects == "dir" and marker.each_holds is not None:
            self.holds(section, key, path, shown, marker.each_holds)

    def holds(self, section: str, key: str, path: Path, shown: str, name: str) -> None:
        if (path / name).is_file():
            return
        children = sorted(
            child
            for child in path.iterdir()
            if child.is_dir() and not child.name.startswith((".", "_"))
        )
        lacking = [child.name for child in children if not (child / name).is_file()]
        if not children:
            message = f"{shown} holds no {name} and no folders that do"
        elif lacking:
            listed = ", ".join(lacking[:5]) + (
                f" and {len(lacking) - 5} more" if lacking[5:] else ""
            )
            message = f"{shown}: these folders hold no {name}: {listed}"
        else:
            return
        self.add(
            "error",
            section,
            key,
            message,
            f"name a folder that holds {name}, or a folder of such folders",
        )

    def model(self, section: str, key: str, value: str, what: str) -> None:
        from rllm_core.models import resolve_model, resolve_tokenizer
        from rllm_core.models.catalog import CATALOG, known_models
        from rllm_core.models.hub import hub_cache_dir, parse_hub_id

        if value in self.reported:
            return  # the renderer's tokenizer filled from the trainer's model: said once
        shown = self.shown(section, key, value)
        catalog = ", ".join(known_models())
        files = "config.json and safetensors weights" if what == "model" else "tokenizer.json"
        try:
            folder = resolve_model(value) if what == "model" else resolve_tokenizer(value)
        except ModelNotCachedError as exc:
            self.reported.add(value)
            hub = parse_hub_id(value)
            if hub is not None and value not in CATALOG and (self.folder / value).parent.is_dir():
                self.add(
                    "error",
                    section,
                    key,
                    f"{shown} is not a folder (resolved to {self.folder / value}) and no Hub id"
                    f" in the Hugging Face cache {hub_cache_dir()}",
                    f"put the {what} files ({files}) there (and write ./{value}), or name a"
                    f" catalog model ({catalog}) or a Hub id",
                )
                return
            pull = f"rllm-core models pull {exc.name}"
            hint = f"run: {pull}"
            if value not in CATALOG:
                message = f"the Hub id {shown} is not in the Hugging Face cache {hub_cache_dir()}"
                hint += " (run, sft and eval download it themselves unless HF_HUB_OFFLINE=1)"
            elif Path(exc.folder).exists():
                message = f"{shown}: {exc}".removesuffix(f"; run: {pull}")
            else:
                message = f"the catalog model {shown} is not pulled yet (into {exc.folder})"
            self.add("warning", section, key, message, hint)
            return
        except ModelError as exc:
            self.reported.add(value)
            if not os.path.isabs(value):
                self.add("error", section, key, f"{shown}: {exc}", None)
                return
            producer = self.producer(value)
            if producer is not None:
                other, table, command = producer
                self.add(
                    "warning",
                    section,
                    key,
                    f"{shown} does not exist yet: {other}'s [{table}].export writes it",
                    f"run `rllm-core {command} {other}` first",
                )
                return
            kind = "folder" if not Path(value).exists() else "model folder"
            self.add(
                "error",
                section,
                key,
                f"{shown} is not a {kind}" + (f": {exc}" if kind == "model folder" else ""),
                f"put the {what} files ({files}) there, or name a catalog model ({catalog}) or a"
                " Hub id (owner/name)",
            )
            return
        if what == "tokenizer" and not any((folder / name).is_file() for name in _TOKENIZER_FILES):
            self.add(
                "error",
                section,
                key,
                f"{shown}: the folder {folder} holds no {' or '.join(_TOKENIZER_FILES)}",
                "put the tokenizer files there, or name a catalog model or a Hub id",
            )
        elif what == "model" and value not in CATALOG and not _has_weights(folder):
            self.add(
                "error",
                section,
                key,
                f"{shown}: the folder {folder} holds config.json but no weights"
                " (*.safetensors or pytorch_model*.bin)",
                "save the whole model there (save_pretrained), or name a catalog model or a Hub id",
            )

    def producer(self, value: str) -> tuple[str, str, str] | None:
        """The plan next to this one whose ``[sft].export`` or ``[run].export`` writes the
        folder ``value``: its path, that table and the command that runs it."""
        mine = Path(self.resolved.path).absolute()
        for other in sorted(self.folder.glob("*.toml")):
            if other.absolute() == mine:
                continue
            try:
                data = read_plan_file(other)
            except PlanError:
                continue
            table, command = ("sft", "sft") if isinstance(data.get("sft"), dict) else ("run", "run")
            found = data.get(table)
            export = found.get("export") if isinstance(found, dict) else None
            if isinstance(export, str) and not export.startswith("~"):
                written = os.path.normpath(os.path.join(self.folder, export))
                if written == os.path.normpath(value):
                    return str(Path(self.resolved.path).parent / other.name), table, command
        return None

    # ------------------------------------------------------------------ credentials

    def credential(
        self, component: ResolvedComponent, section: str, base: str, credential: Credential
    ) -> None:
        names = credential.variables(component.config)
        needed = " and ".join(names)
        ways = [f"export {' '.join(f'{name}=...' for name in names)}"]
        if credential.key is not None:
            ways.append(f"set {credential.key} in the plan")
        ways += [
            f"export {' '.join(f'{name}=...' for name in group)}" for group in credential.also_env
        ]
        if credential.login is not None:
            ways.append(f"run `{credential.login}`")
        elif credential.files:
            ways.append("write " + " or ".join(credential.files))
        key = credential.env_key or credential.key
        where = f"{base}.{key}" if base and key else (key or base or None)
        self.add(
            "warning",
            section,
            where,
            f"{component.kind.label} {component.name!r} needs the {credential.what}, and"
            f" {needed} {'is' if len(names) == 1 else 'are'} not set",
            "; or ".join(ways),
        )


def _location(where: str) -> tuple[str, str]:
    """``"[algorithm].aux_losses[0]"`` as section ``algorithm`` and key ``aux_losses[0]``."""
    match = re.match(r"^\[(.+?)\](?:\.(.*))?$", where)
    if match is None:
        return where, ""
    return match[1], match[2] or ""


def _lookup(raw: Mapping[str, Any], section: str, key: str) -> Any:
    """The value the plan file writes at ``[section].key``, or None."""
    node: Any = raw
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", f"{section}.{key}" if key else section):
        if part.startswith("["):
            index = int(part[1:-1])
            node = node[index] if isinstance(node, list) and index < len(node) else None
        else:
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None
    return node


def _has_weights(folder: Path) -> bool:
    return any(next(folder.glob(pattern), None) is not None for pattern in _WEIGHTS)


def _marked(
    model: type[BaseModel], config: BaseModel, prefix: str
) -> Iterator[tuple[str, str, PlanPath]]:
    """Each ``(key, value, marker)`` of ``config`` whose key a :class:`PlanPath` with
    ``expects`` marks, nested tables, lists and maps included."""
    for name, field in model.model_fields.items():
        key = f"{prefix}.{field.alias or name}" if prefix else (field.alias or name)
        yield from _walk(getattr(config, name, None), field.annotation, field.metadata, key)


def _walk(
    value: Any, annotation: Any, metadata: Sequence[Any], key: str
) -> Iterator[tuple[str, str, PlanPath]]:
    if value is None:
        return
    marker = next((m for m in metadata if isinstance(m, PlanPath)), None)
    if marker is not None and marker.expects is not None:
        if isinstance(value, (str, PurePath)):
            yield key, str(value), marker
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                yield key + f"[{index}]", str(item), marker
        elif isinstance(value, Mapping):
            for name, item in value.items():
                yield f"{key}.{name}", str(item), marker
        return
    if marker is not None:
        return
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        yield from _walk(value, args[0], args[1:], key)
    elif args and origin not in (list, tuple, set, frozenset, dict, Sequence, Mapping):
        for arg in args:  # a union: the first member that marks something
            found = list(_walk(value, arg, (), key)) if arg is not type(None) else []
            if found:
                yield from found
                return
    elif isinstance(value, (list, tuple)) and args:
        for index, item in enumerate(value):
            yield from _walk(item, args[0], (), f"{key}[{index}]")
    elif isinstance(value, Mapping) and len(args) == 2:
        for name, item in value.items():
            yield from _walk(item, args[1], (), f"{key}.{name}")
    elif isinstance(value, BaseModel):
        yield from _marked(type(value), value, key)
