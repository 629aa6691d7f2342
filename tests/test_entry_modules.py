"""Every plugin's entry module imports light, and every first-party plugin has the shape the
repository promises (``plugins/<kinds>/<name>/`` is distribution ``rllm-<kind>-<name>``, import
``rllm_<kind>_<name>``, with README.md, src/ and tests/; the folder names the kind in the plural,
the distribution in the singular: ``plugins/losses/ppo`` is ``rllm-loss-ppo``,
``plugins/trainer-backends/torch`` is ``rllm-trainer-backend-torch``), and provides components
of that kind only.

``rllm-core plugins`` imports every installed entry module; one that pulls in torch or an SDK
makes every command slow, and one that fails breaks the listing for that plugin. Heavy code must
sit behind ``rllm_core.lazy("module:Class")``.
"""

from __future__ import annotations

import re

HEAVY_MODULES = (
    "torch",
    "numpy",
    "transformers",
    "modal",
    "daytona",
    "daytona_sdk",
    "tinker",
    "fireworks",
)

# Runs in a fresh interpreter: import the core and pydantic (always allowed), then the entry
# module, and report what the entry module itself added: heavy modules, and top-level modules
# that are neither the standard library, the plugin's own package, nor rllm-core and the
# distributions it depends on.
_PROBE = r"""
import importlib
import importlib.metadata as metadata
import json
import re
import sys

heavy = set(sys.argv[1].split(","))
module = sys.argv[2]
own = module.split(".")[0]

import pydantic
import rllm_core

before = set(sys.modules)
importlib.import_module(module)
added = {name.split(".")[0] for name in set(sys.modules) - before}


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_closure(root):
    seen, todo = set(), [root]
    while todo:
        name = normalize(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requirements = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for requirement in requirements:
            if re.search(r"extra\s*==", requirement):
                continue
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
            if match:
                todo.append(match.group(1))
    return seen


allowed_dists = dependency_closure("rllm-core")
providers = metadata.packages_distributions()
foreign = {}
for top in sorted(added - set(sys.stdlib_module_names) - {own, "rllm_core"}):
    dists = [normalize(d) for d in providers.get(top, [])]
    if not any(d in allowed_dists for d in dists):
        loaded = sys.modules.get(top)
        foreign[top] = dists or [getattr(loaded, "__file__", None) or "unknown origin"]

print(json.dumps({
    "heavy": sorted({name.split(".")[0] for name in sys.modules} & heavy),
    "foreign": foreign,
    "own": sorted(
        name for name in set(sys.modules) - before
        if name.split(".")[0] == own and name not in (own, module)
    ),
}))
"""


_PROBED: dict[str, dict] = {}
"""What each installed entry module imports: the same for the three tests that read it."""


def _probe(run_python, module: str, heavy: tuple[str, ...] = HEAVY_MODULES) -> dict:
    result = run_python(_PROBE, ",".join(heavy), module)
    assert result.returncode == 0, (
        f"importing entry module {module!r} failed; is its package installed"
        f" (scripts/setup.sh installs every package)?\n{result}"
    )
    return result.json()


def _probed(run_python, module: str) -> dict:
    if module not in _PROBED:
        _PROBED[module] = _probe(run_python, module)
    return _PROBED[module]


def test_probe_reports_heavy_foreign_and_own_imports_exactly(run_python, tmp_path):
    (tmp_path / "probe_light.py").write_text("import json\nimport pydantic\nimport rich\n")
    # a stand-in SDK under a name no real package has, so the check does not depend on what
    # this machine has installed
    (tmp_path / "probe_fake_sdk.py").write_text("")
    (tmp_path / "probe_heavy.py").write_text("import probe_fake_sdk\nimport iniconfig\n")
    heavy = (*HEAVY_MODULES, "probe_fake_sdk")
    assert _probe(run_python, "probe_light", heavy) == {"heavy": [], "foreign": {}, "own": []}
    probed = _probe(run_python, "probe_heavy", heavy)
    assert probed["heavy"] == ["probe_fake_sdk"]
    assert sorted(probed["foreign"]) == ["iniconfig", "probe_fake_sdk"]
    assert probed["foreign"]["iniconfig"] == ["iniconfig"]
    assert probed["foreign"]["probe_fake_sdk"][0].endswith("probe_fake_sdk.py")

    package = tmp_path / "probe_eager"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "impl.py").write_text("")
    (package / "plugin.py").write_text("from probe_eager import impl\n")
    assert _probe(run_python, "probe_eager.plugin", heavy)["own"] == ["probe_eager.impl"]


def test_entry_module_does_not_import_heavy_modules(entry_package, run_python):
    assert entry_package.entry_modules, (
        f"{entry_package.id}/pyproject.toml declares no [project.entry-points.rllm_core] entry;"
        ' add `<name> = "<import_name>.plugin"` so rllm-core can discover it'
    )
    for module in entry_package.entry_modules:
        heavy = _probed(run_python, module)["heavy"]
        assert heavy == [], (
            f"importing {module} ({entry_package.distribution}) loads {', '.join(heavy)};"
            " import those inside the implementation module and point the spec's factory at it"
            " with rllm_core.lazy('module:Class')"
        )


def test_entry_module_imports_only_core_and_stdlib(entry_package, run_python):
    for module in entry_package.entry_modules:
        foreign = _probed(run_python, module)["foreign"]
        assert foreign == {}, (
            f"importing {module} ({entry_package.distribution}) loads modules outside rllm-core,"
            f" its dependencies and the standard library: {foreign}; an entry module may import"
            " only rllm_core, pydantic and the standard library, so move those imports into the"
            " implementation and reference it with rllm_core.lazy('module:Class')"
        )


def test_entry_module_loads_no_other_module_of_its_package(entry_package, run_python):
    for module in entry_package.entry_modules:
        own = _probed(run_python, module)["own"]
        assert own == [], (
            f"importing {module} ({entry_package.distribution}) also loads {', '.join(own)};"
            " the implementation must load only when a plan builds the component: name it with"
            " rllm_core.lazy('module:Class')"
        )


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else requirement


FOLDER_KINDS = {
    "losses": "loss",
    "advantage-estimators": "advantage_estimator",
    "renderers": "renderer",
    "sandbox-backends": "sandbox_backend",
    "trainer-backends": "trainer_backend",
    "harnesses": "harness",
    "task-sources": "task_source",
    "trace-stores": "trace_store",
    "sample-buffers": "sample_buffer",
    "object-stores": "object_store",
    "loggers": "logger",
    "samplers": "sampler",
    "trainer-launchers": "trainer_launcher",
}
"""Each plugin folder and the component kind it holds (``rllm-core plugins`` prints the kind
before ``:name``): the folder is the kind in the plural, with ``-`` for ``_``."""

ALSO_PROVIDES = {"rllm-sandbox-backend-modal": {"trainer_launcher:modal"}}
"""Components a package provides besides its folder's kind, each with its reason: the Modal
sandbox backend also runs trainer incarnations in Modal sandboxes, over the same SDK calls and
the same offline fake of them."""


def test_every_kind_has_its_folder():
    from rllm_core.plugins.specs import Kind

    assert sorted(FOLDER_KINDS.values()) == sorted(kind.value for kind in Kind)


def test_each_first_party_package_provides_only_its_folders_kind(run_python, first_party_plugins):
    listing = run_python(
        "import json, subprocess, sys\n"
        "out = subprocess.run([sys.executable, '-m', 'rllm_core.cli', 'plugins', '--json'],"
        " capture_output=True, text=True, check=True).stdout\n"
        "print(out)\n"
    )
    assert listing.returncode == 0, str(listing)
    plugins = listing.json()
    by_distribution = {p.distribution: p for p in first_party_plugins}
    problems = []
    seen = set()
    for record in plugins:
        package = by_distribution.get(record["distribution"])
        if package is None:
            continue
        seen.add(record["distribution"])
        kind = FOLDER_KINDS[package.folder.parent.name]
        also = ALSO_PROVIDES.get(record["distribution"], set())
        for key in record["provides"]:
            if key.partition(":")[0] != kind and key not in also:
                problems.append(f"{package.id} provides {key}; plugins/{package.id} holds {kind}")
    assert problems == []
    assert seen == set(by_distribution), "every first-party plugin is installed and listed"


def test_plugin_package_layout(plugin_package):
    folder = plugin_package.folder
    folder_kind, name = folder.parent.name, folder.name
    assert folder_kind in FOLDER_KINDS, (
        f"plugins/{folder_kind}/ is not a plugin folder; use one of {sorted(FOLDER_KINDS)}"
    )
    kind = FOLDER_KINDS[folder_kind].replace("_", "-")
    expected_dist = f"rllm-{kind}-{name}"
    import_name = f"rllm_{kind}_{name}".replace("-", "_")

    problems = []
    if plugin_package.distribution != expected_dist:
        problems.append(
            f"[project].name is {plugin_package.distribution!r}; a package in"
            f" plugins/{folder_kind}/{name}/ must be named {expected_dist!r}"
        )
    if not (folder / "README.md").is_file():
        problems.append("README.md is missing: every plugin documents itself")
    for required in ("src", "tests"):
        if not (folder / required).is_dir():
            problems.append(f"{required}/ is missing: every plugin has src/ and tests/")
    if (folder / "src").is_dir() and not (folder / "src" / import_name).is_dir():
        problems.append(f"src/{import_name}/ is missing: the import name must be {import_name}")
    if "rllm-core" not in {_requirement_name(r) for r in plugin_package.dependencies}:
        problems.append("[project].dependencies must include rllm-core")
    for module in plugin_package.entry_modules:
        if module != import_name and not module.startswith(import_name + "."):
            problems.append(
                f"entry point module {module!r} is outside the package {import_name};"
                f" use {import_name}.plugin"
            )

    assert problems == [], f"{plugin_package.id}:\n  " + "\n  ".join(problems)
