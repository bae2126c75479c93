"""foundry_core.engine.hookspecs / plugin_manager: adapter registration and validation."""

from __future__ import annotations

import types

import pytest

from test_engine_support import FakeAdapter

from foundry_core.engine import hookspecs
from foundry_core.engine.hookspecs import REQUIRED_HOOKS, hookimpl
from foundry_core.engine.plugin_manager import FoundryPluginManager, get_plugin_manager
from foundry_core.errors import InvalidArgumentError


class Minimal:
    def foundry_engine_identity(self):
        return ("e", "1")

    def foundry_model_identity(self):
        return {"m": 1}

    def foundry_capture_sizes(self):
        return [1]

    def foundry_parallel_config(self):
        return {"tp": 1}


def test_full_adapter_registers_and_answers():
    adapter = FakeAdapter()
    pm = get_plugin_manager(adapter)
    assert pm.hook.foundry_engine_identity() == ("fakeengine", "1.2.3")
    assert pm.hook.foundry_capture_sizes() == [1, 2, 4, 8]
    assert pm.hook.foundry_graph_knobs() == [{"cudagraph_mode": "FULL_DECODE_ONLY"}]  # collected, not firstresult
    pm.hook.foundry_on_fallback(reason="r", mode="save")
    assert adapter.fallbacks == [("r", "save")]


def test_project_name_is_foundry():
    assert get_plugin_manager(Minimal()).project_name == "foundry"


def test_undecorated_misspelt_hook_is_refused_with_a_suggestion():
    class Misspelt(Minimal):
        def foundry_capture_size(self):  # missing "s"
            return [1]

    with pytest.raises(InvalidArgumentError) as info:
        get_plugin_manager(Misspelt())
    message = str(info.value)
    assert "'foundry_capture_size'" in message and "did you mean 'foundry_capture_sizes'" in message
    assert "Misspelt" in message


def test_decorated_misspelt_hook_is_refused():
    class Misspelt(Minimal):
        @hookimpl
        def foundry_on_fallbak(self, reason):
            pass

    with pytest.raises(InvalidArgumentError, match="did you mean 'foundry_on_fallback'"):
        get_plugin_manager(Misspelt())


def test_refused_adapter_leaves_the_manager_untouched():
    class Misspelt(Minimal):
        def foundry_graph_knob(self):
            return {}

    pm = FoundryPluginManager()
    with pytest.raises(InvalidArgumentError):
        pm.register_adapter(Misspelt())
    assert pm.list_name_plugin() == []


def test_hook_with_arguments_the_spec_lacks_is_refused():
    class WrongArgs(Minimal):
        def foundry_on_fallback(self, why):
            pass

    with pytest.raises(InvalidArgumentError, match="why"):
        get_plugin_manager(WrongArgs())


def test_hook_may_take_a_subset_of_the_arguments():
    seen = []

    class ReasonOnly(Minimal):
        def foundry_on_fallback(self, reason):
            seen.append(reason)

    pm = get_plugin_manager(ReasonOnly())
    pm.hook.foundry_on_fallback(reason="stale", mode="save")
    assert seen == ["stale"]


def test_missing_required_hooks_are_named():
    class Partial:
        def foundry_engine_identity(self):
            return ("e", "1")

    with pytest.raises(InvalidArgumentError) as info:
        get_plugin_manager(Partial())
    for hook in ("foundry_model_identity", "foundry_capture_sizes", "foundry_parallel_config"):
        assert hook in str(info.value)
    assert "foundry_engine_identity" not in str(info.value).split("(adapters")[0]


def test_required_hooks_may_come_from_several_adapters():
    class Identity:
        def foundry_engine_identity(self):
            return ("e", "1")

    class Rest:
        def foundry_model_identity(self):
            return {}

        def foundry_capture_sizes(self):
            return [1]

        def foundry_parallel_config(self):
            return {}

    pm = get_plugin_manager(Identity(), Rest())
    assert pm.missing_hooks() == []


def test_no_adapter_is_fine_without_require():
    pm = get_plugin_manager(require=False)
    assert pm.missing_hooks() == list(REQUIRED_HOOKS)
    with pytest.raises(InvalidArgumentError, match="no engine adapter implements"):
        pm.validate()


def test_first_result_wins_and_tryfirst_is_honoured():
    class Late(Minimal):
        def foundry_capture_sizes(self):
            return [1, 2]

    class Early:
        @hookimpl(tryfirst=True)
        def foundry_capture_sizes(self):
            return [8]

    class Abstains:
        @hookimpl(tryfirst=True)
        def foundry_engine_identity(self):
            return None

    pm = get_plugin_manager(Late(), Early(), Abstains())
    assert pm.hook.foundry_capture_sizes() == [8]
    assert pm.hook.foundry_engine_identity() == ("e", "1")


def test_module_adapter():
    mod = types.ModuleType("my_engine_adapter")
    for name in REQUIRED_HOOKS:
        setattr(mod, name, getattr(Minimal(), name))
    mod.foundry_version = "not a hook: not callable"
    mod.helper = lambda: None
    pm = get_plugin_manager(mod)
    assert pm.hook.foundry_model_identity() == {"m": 1}
    assert pm.get_name(mod) == "my_engine_adapter"


def test_same_adapter_twice_is_refused():
    adapter = Minimal()
    pm = get_plugin_manager(adapter)
    with pytest.raises(InvalidArgumentError, match="already registered"):
        pm.register_adapter(adapter)


def test_spec_module_lists_every_hook_the_session_uses():
    names = {n for n in dir(hookspecs) if n.startswith("foundry_")}
    assert names == {"foundry_engine_identity", "foundry_model_identity", "foundry_capture_sizes",
                     "foundry_parallel_config", "foundry_dtype", "foundry_graph_knobs", "foundry_record_state",
                     "foundry_on_fallback"}
