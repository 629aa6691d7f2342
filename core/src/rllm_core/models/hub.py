"""Hugging Face Hub ids (``owner/name``, optionally ``owner/name@revision``) read from the
Hugging Face cache on this machine.

Resolving reads the cache layout directly (``<cache>/models--owner--name/refs/<revision>``
holds a commit hash, ``snapshots/<hash>/`` the files), so it works offline and needs no
package. Nothing is downloaded while resolving: :func:`download_hub_model` (``rllm-core
models pull owner/name``, and :func:`fetch_missing_hub_model`, which ``rllm-core run``, ``sft``
and ``eval`` call before they resolve a plan, unless ``HF_HUB_OFFLINE`` is set) is the one place
that reaches the Hub, through ``huggingface_hub``; ``plan check`` never downloads.
The cache folder is the one ``huggingface_hub`` uses: ``HF_HUB_CACHE``, else ``HF_HOME/hub``,
else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rllm_core.errors import ModelNotCachedError, ModelPullError

__all__ = [
    "HubId",
    "download_hub_model",
    "fetch_missing_hub_model",
    "hub_cache_dir",
    "hub_offline",
    "parse_hub_id",
    "resolve_hub_id",
]

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[A-Za-z0-9._/-]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class HubId:
    """A parsed Hub id: ``repo`` (``owner/name``) and the ``revision`` (``main`` when none is
    written: a branch, a tag or a 40-digit commit hash)."""

    repo: str
    revision: str = "main"

    def __str__(self) -> str:
        return self.repo if self.revision == "main" else f"{self.repo}@{self.revision}"

    def cache_folder(self, cache: Path) -> Path:
        """Where the Hugging Face cache ``cache`` keeps this repository."""
        return cache / ("models--" + self.repo.replace("/", "--"))


def parse_hub_id(value: str) -> HubId | None:
    """The :class:`HubId` ``value`` spells (``owner/name`` or ``owner/name@revision``), or None
    when it is not one (a path with more parts, ``./x``, an absolute path, a bare word)."""
    match = _HUB_ID.match(value)
    if match is None or ".." in match["repo"]:
        return None
    return HubId(match["repo"], match["revision"] or "main")


def hub_cache_dir() -> Path:
    """The Hugging Face cache folder, from the environment as ``huggingface_hub`` reads it."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def resolve_hub_id(
    hub_id: HubId, *, needs: Sequence[str] = ("config.json",), what: str = "model"
) -> Path:
    """The snapshot folder of ``hub_id`` in the Hugging Face cache, checked to hold one of the
    files ``needs`` names.

    Raises :class:`~rllm_core.errors.ModelNotCachedError` naming the id, the cache folder and
    how to fill it when the revision is not cached or its snapshot lacks those files.
    """
    cache = hub_cache_dir()
    repo_folder = hub_id.cache_folder(cache)
    commit = _commit(repo_folder, hub_id.revision)
    snapshot = repo_folder / "snapshots" / commit if commit else None
    if snapshot is None or not snapshot.is_dir():
        raise ModelNotCachedError(
            f"the Hugging Face {what} {str(hub_id)!r} is not in the Hugging Face cache {cache}"
            f" (no {repo_folder.name} snapshot for revision {hub_id.revision!r}); download it"
            f" with: rllm-core models pull {hub_id} (or huggingface-cli download {hub_id.repo}"
            f"{'' if hub_id.revision == 'main' else f' --revision {hub_id.revision}'}), or point"
            " HF_HUB_CACHE / HF_HOME at the cache that holds it. A local folder of that name"
            " is written ./" + hub_id.repo,
            name=str(hub_id),
            folder=str(repo_folder),
        )
    if not any((snapshot / name).is_file() for name in needs):
        raise ModelNotCachedError(
            f"the cached snapshot of {str(hub_id)!r} in {snapshot} holds no {' or '.join(needs)},"
            f" so it is no {what}; download it whole with: rllm-core models pull {hub_id}",
            name=str(hub_id),
            folder=str(snapshot),
        )
    return snapshot


def _commit(repo_folder: Path, revision: str) -> str | None:
    ref = repo_folder / "refs" / revision
    if ref.is_file():
        return ref.read_text(encoding="utf-8").strip() or None
    if _COMMIT.match(revision):
        return revision
    return None


def download_hub_model(hub_id: HubId, *, progress: Callable[[str], None] | None = None) -> Path:
    """Download ``hub_id`` into the Hugging Face cache with ``huggingface_hub`` (which honours
    ``HF_HUB_OFFLINE`` and ``HF_TOKEN``) and return its snapshot folder. Raises
    :class:`~rllm_core.errors.ModelPullError` saying why it failed."""
    say = progress or (lambda line: None)
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelPullError(
            f"downloading {hub_id} needs huggingface_hub; pip install rllm-trainer-backend-torch"
            " (or huggingface_hub)",
            name=str(hub_id),
        ) from None
    cache = hub_cache_dir()
    say(f"downloading {hub_id} from the Hugging Face Hub into {cache}")
    try:
        folder = snapshot_download(hub_id.repo, revision=hub_id.revision, cache_dir=str(cache))
    except Exception as exc:  # the library raises many kinds: offline, not found, HTTP, disk
        raise ModelPullError(
            f"could not download {hub_id} into {cache}: {exc}; check the id, the network,"
            " HF_HUB_OFFLINE and HF_TOKEN for a gated or private model",
            name=str(hub_id),
        ) from exc
    say(f"cached {hub_id} in {folder}")
    return Path(folder)


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids reaching the Hub, read as ``huggingface_hub`` reads
    it."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def fetch_missing_hub_model(
    value: str, *, needs: Sequence[str] = ("config.json",), progress: Callable[[str], None]
) -> Path | None:
    """Download ``value`` when it is a Hub id whose revision is not in the cache and the Hub
    may be reached (``HF_HUB_OFFLINE`` unset); return the snapshot it downloaded, or None when
    there was nothing to do: ``value`` is a catalog name, an existing folder, no Hub id, or
    already cached. With ``HF_HUB_OFFLINE`` set it downloads nothing, and resolving later
    raises the error that names the id and the cache.
    """
    from rllm_core.models.catalog import CATALOG

    if value in CATALOG or Path(value).expanduser().exists():
        return None
    hub_id = parse_hub_id(value)
    if hub_id is None or hub_offline():
        return None
    try:
        resolve_hub_id(hub_id, needs=needs)
    except ModelNotCachedError:
        return download_hub_model(hub_id, progress=progress)
    return None
