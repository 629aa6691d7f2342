"""Discovery, error isolation, blocking and conflicts, over fake ``*.dist-info`` folders."""

from __future__ import annotations

import pytest
from fake_plugins import (
    BROKEN_IMPORT,
    MISSPELLED,
    RAISING_HOOK,
    UNMARKED,
    WRONG_SPEC,
    loss_plugin,
)
from rllm_core import ComponentSpec, hookimpl, lazy
from rllm_core.errors import ComponentConflictError, PluginLoadError, UnknownComponentError
from rllm_core.plugins import Kind, PluginManager, PluginStatus
from rllm_core.plugins.catalog import FIRST_PARTY


def fake(fakes, dist: str, module: str, source: str, version: str = "1.0.0"):
    return fakes.add(dist, version=version, entry_points={module: module}, modules={module: source})


def manager(**kwargs) -> PluginManager:
    kwargs.setdefault("strict", False)
    return PluginManager(**kwargs)


def record(pm: PluginManager, distribution: str):
    matches = [r for r in pm.plugins() if r.distribution == distribution]
    assert len(matches) == 1, [r.distribution for r in pm.plugins()]
    return matches[0]


def test_discovers_a_fake_distribution(fake_distributions):
    fake(fake_distributions, "rllm-loss-alpha", "fake_alpha", loss_plugin("alpha"), "2.3.4")
    pm = manager()
    alpha = record(pm, "rllm-loss-alpha")
    assert alpha.status is PluginStatus.ACTIVE
    assert alpha.version == "2.3.4"
    assert alpha.components == ["loss:alpha"]
    spec = pm.get("loss", "alpha")
    assert spec.build({"scale": 3}) == ("built", 3.0)


def test_broken_import_is_recorded_not_raised(fake_distributions):
    fake(fake_distributions, "rllm-loss-broken", "fake_broken", BROKEN_IMPORT)
    fake(fake_distributions, "rllm-loss-alpha", "fake_alpha", loss_plugin("alpha"))
    pm = manager()
    broken = record(pm, "rllm-loss-broken")
    assert broken.status is PluginStatus.ERROR
    assert "this plugin is broken on purpose" in broken.error
    assert "RuntimeError" in broken.traceback
    assert pm.get("loss", "alpha").name == "alpha"
    assert pm.has_errors()


def test_strict_mode_raises_on_broken_import(fake_distributions):
    fake(fake_distributions, "rllm-loss-broken", "fake_broken", BROKEN_IMPORT)
    with pytest.raises(PluginLoadError, match="rllm-loss-broken"):
        manager(strict=True).plugins()


def test_strict_mode_follows_the_environment(fake_distributions, monkeypatch):
    fake(fake_distributions, "rllm-loss-broken", "fake_broken", BROKEN_IMPORT)
    monkeypatch.setenv("RLLM_CORE_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError):
        PluginManager().plugins()
    monkeypatch.setenv("RLLM_CORE_STRICT_PLUGINS", "0")
    assert record(PluginManager(), "rllm-loss-broken").status is PluginStatus.ERROR


def test_disable_by_distribution_name(fake_distributions, monkeypatch):
    fake(fake_distributions, "rllm-loss-alpha", "fake_alpha", loss_plugin("alpha"))
    fake(fake_distributions, "rllm-loss-beta", "fake_beta", loss_plugin("beta"))
    monkeypatch.setenv("RLLM_CORE_DISABLE_PLUGINS", "rllm_loss_alpha, other")
    pm = manager()
    assert record(pm, "rllm-loss-alpha").status is PluginStatus.DISABLED
    assert record(pm, "rllm-loss-beta").status is PluginStatus.ACTIVE
    assert "beta" in pm.names(Kind.LOSS)
    assert "alpha" not in pm.names(Kind.LOSS)


def test_disabled_plugin_is_never_imported(fake_distributions):
    fake(fake_distributions, "rllm-loss-broken", "fake_broken", BROKEN_IMPORT)
    pm = manager(strict=True, disabled=["rllm-loss-broken"])
    assert record(pm, "rllm-loss-broken").status is PluginStatus.DISABLED


def test_conflict_names_both_distributions(fake_distributions):
    fake(fake_distributions, "rllm-loss-one", "fake_one", loss_plugin("x"), "1.0")
    fake(fake_distributions, "rllm-loss-two", "fake_two", loss_plugin("x"), "2.0")
    pm = manager()
    assert record(pm, "rllm-loss-one").status is PluginStatus.CONFLICT
    assert record(pm, "rllm-loss-two").status is PluginStatus.CONFLICT
    assert "also provided by rllm-loss-two 2.0" in record(pm, "rllm-loss-one").conflicts[0]
    with pytest.raises(ComponentConflictError) as info:
        pm.get("loss", "x")
    assert info.value.providers == ["rllm-loss-one 1.0", "rllm-loss-two 2.0"]
    assert "rllm-loss-one 1.0 and rllm-loss-two 2.0" in str(info.value)
    assert "x" not in pm.names(Kind.LOSS)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (MISSPELLED, "rllm_loses is not an rllm-core hook; did you mean rllm_losses?"),
        (UNMARKED, "rllm_losses is not marked with @hookimpl"),
        (WRONG_SPEC, "rllm_losses() yielded a renderer spec, expected a ComponentSpec of kind"),
        (RAISING_HOOK, "rllm_losses() raised ValueError: cannot list losses"),
    ],
    ids=["misspelled", "unmarked", "wrong-spec", "raising-hook"],
)
def test_plugin_mistakes_are_reported_against_the_plugin(fake_distributions, source, message):
    fake(fake_distributions, "rllm-loss-sloppy", "fake_sloppy", source)
    fake(fake_distributions, "rllm-loss-alpha", "fake_alpha", loss_plugin("alpha"))
    pm = manager()
    sloppy = record(pm, "rllm-loss-sloppy")
    assert sloppy.status is PluginStatus.ERROR
    assert message in sloppy.error
    assert sloppy.components == []
    assert "alpha" in pm.names(Kind.LOSS)
    assert not {"misspelled", "unmarked", "oops"} & set(pm.names(Kind.LOSS))


def test_unknown_component_suggests_and_lists(plugin_manager, register_plugin):
    class Losses:
        @hookimpl
        def rllm_losses(self):
            yield ComponentSpec(kind="loss", name="dppo-tv", factory=print, summary="a")
            yield ComponentSpec(kind="loss", name="ppo-clip", factory=print, summary="b")

    register_plugin(Losses(), name="losses")
    with pytest.raises(UnknownComponentError) as info:
        plugin_manager.get("loss", "dppo_tvv")
    assert info.value.suggestion == "dppo-tv"
    assert info.value.available == ["dppo-tv", "ppo-clip"]
    assert "did you mean 'dppo-tv'?" in str(info.value)


def test_unknown_first_party_component_names_its_package(plugin_manager):
    with pytest.raises(UnknownComponentError) as info:
        plugin_manager.get("trainer_backend", "torch")
    assert info.value.provider == "rllm-trainer-backend-torch"
    assert "pip install rllm-trainer-backend-torch" in str(info.value)


def test_missing_component_of_a_broken_first_party_plugin_shows_the_failure(
    fake_distributions, monkeypatch
):
    monkeypatch.setitem(FIRST_PARTY[Kind.LOSS], "omega", "rllm-loss-omega")
    fake(fake_distributions, "rllm-loss-omega", "fake_omega", BROKEN_IMPORT)
    pm = manager()
    with pytest.raises(UnknownComponentError) as info:
        pm.get("loss", "omega")
    message = str(info.value)
    assert "rllm-loss-omega 1.0.0, which failed to load" in message
    assert "this plugin is broken on purpose" in message


def test_names_are_canonical(plugin_manager, register_plugin):
    class Losses:
        @hookimpl
        def rllm_losses(self):
            yield ComponentSpec(kind="loss", name="My_Loss", factory=print, summary="a")

    register_plugin(Losses(), name="losses")
    assert plugin_manager.get("loss", "MY-LOSS").name == "my-loss"
    assert plugin_manager.get("loss", "my_loss").name == "my-loss"


def test_lazy_factory_imports_on_build_only(fake_distributions):
    fake_distributions.add(
        "rllm-loss-lazy",
        entry_points={"fake_lazy": "fake_lazy"},
        modules={
            "fake_lazy": """
                from rllm_core import ComponentSpec, hookimpl, lazy

                @hookimpl
                def rllm_losses():
                    yield ComponentSpec(kind="loss", name="lazy",
                                        factory=lazy("fake_lazy_impl:Loss"),
                                        summary="built on demand")
            """,
            "fake_lazy_impl": """
                class Loss:
                    def __init__(self, config):
                        self.config = config
            """,
        },
    )
    import sys

    pm = manager(strict=True)
    spec = pm.get("loss", "lazy")
    assert "fake_lazy_impl" not in sys.modules
    assert spec.factory_path == "fake_lazy_impl:Loss"
    built = spec.build()
    assert type(built).__name__ == "Loss"
    assert "fake_lazy_impl" in sys.modules


def test_lazy_target_must_name_an_attribute():
    with pytest.raises(ValueError, match="module:attr"):
        lazy("just_a_module")


def test_register_rejects_duplicate_names(plugin_manager, register_plugin):
    register_plugin(object(), name="same")
    with pytest.raises(ValueError, match="already registered"):
        register_plugin(object(), name="same")


def test_unregister_removes_components(plugin_manager, register_plugin):
    class Losses:
        @hookimpl
        def rllm_losses(self):
            yield ComponentSpec(kind="loss", name="gone-soon", factory=print, summary="a")

    register_plugin(Losses(), name="losses")
    assert plugin_manager.names(Kind.LOSS) == ["gone-soon"]
    plugin_manager.unregister("losses")
    assert plugin_manager.names(Kind.LOSS) == []


def test_missing_component_of_a_disabled_first_party_plugin_says_so(
    fake_distributions, monkeypatch
):
    monkeypatch.setitem(FIRST_PARTY[Kind.LOSS], "omega", "rllm-loss-omega")
    fake(fake_distributions, "rllm-loss-omega", "fake_omega", loss_plugin("omega"))
    pm = manager(disabled=["rllm-loss-omega"])
    with pytest.raises(UnknownComponentError, match="which is disabled by RLLM_CORE_DISABLE"):
        pm.get("loss", "omega")
