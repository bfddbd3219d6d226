"""The effect registry: discovery by entry point, checks at registration, config checks."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from broker.context import Memo
from broker.errors import ConfigError, DuplicateEffect, RegistryError, UnknownEffect
from broker.registry import Registry, default_registry
from broker.testing import BrokerHarness, FakeHandler, make_context
from broker.validation import load_schema
from effects.files import FilesWrite

PluginMaker = Callable[[str, str], str]


@pytest.fixture
def install_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PluginMaker:
    """Install a throwaway distribution declaring one `broker.effects` entry point.

    Call it with the module's source and the object's name in it; it returns the
    distribution's name.
    """

    def install(source: str, target: str) -> str:
        module = f"plugin_{uuid.uuid4().hex[:12]}"
        dist = f"{module}_dist"
        site = tmp_path / module
        info = site / f"{dist}-1.0.dist-info"
        info.mkdir(parents=True)
        (site / f"{module}.py").write_text(source)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[broker.effects]\nzz = {module}:{target}\n")
        monkeypatch.syspath_prepend(str(site))
        return dist

    return install


def test_entry_points_load_files_write() -> None:
    """The built-in files.write is found through the entry-point group."""
    registry = default_registry()
    handler = registry.get("files.write")
    assert isinstance(handler, FilesWrite)
    assert handler.reversible is True and handler.idempotent is True
    assert handler.schema == load_schema("files.write")
    assert "effects.files:FilesWrite" in registry.origin("files.write")


def test_third_party_plugin_is_found_like_a_builtin(install_plugin: PluginMaker) -> None:
    """An installed plugin's handler is registered with its distribution as origin."""
    dist = install_plugin(
        "from broker.testing import FakeHandler\nHANDLERS = [FakeHandler('demo.ping')]\n",
        "HANDLERS",
    )
    registry = default_registry()
    assert "demo.ping" in registry and "files.write" in registry
    assert dist in registry.origin("demo.ping")


def test_duplicate_registration_names_both_origins() -> None:
    """Registering a name twice raises DuplicateEffect naming the first and second origin."""
    registry = Registry()
    registry.register(FakeHandler("demo.ping"), "plugin-a")
    with pytest.raises(DuplicateEffect) as info:
        registry.register(FakeHandler("demo.ping"), "plugin-b")
    assert "demo.ping" in str(info.value)
    assert "plugin-a" in str(info.value) and "plugin-b" in str(info.value)
    assert registry.origin("demo.ping") == "plugin-a"


def test_plugin_claiming_a_builtin_name_names_both(install_plugin: PluginMaker) -> None:
    """A plugin that also claims files.write is refused, naming both distributions."""
    dist = install_plugin(
        "from broker.testing import FakeHandler\nH = FakeHandler('files.write')\n", "H"
    )
    with pytest.raises(DuplicateEffect) as info:
        default_registry()
    message = str(info.value)
    assert "files.write" in message
    assert "effects.files:FilesWrite" in message
    assert dist in message


def test_plugin_that_cannot_be_imported_names_itself(install_plugin: PluginMaker) -> None:
    """A plugin whose import fails stops the start with its own name and the reason."""
    dist = install_plugin("raise ImportError('needs libfoo')\n", "H")
    with pytest.raises(RegistryError) as info:
        default_registry()
    assert dist in str(info.value)
    assert "needs libfoo" in str(info.value)


def test_plugin_pointing_at_something_else_names_itself(install_plugin: PluginMaker) -> None:
    """An entry point that names a plain value, not a handler, is refused with its origin."""
    dist = install_plugin("H = 42\n", "H")
    with pytest.raises(RegistryError) as info:
        default_registry()
    assert dist in str(info.value)


def test_plugin_with_bad_handler_names_itself(install_plugin: PluginMaker) -> None:
    """A plugin whose handler breaks the contract is refused, naming the plugin."""
    dist = install_plugin(
        "from broker.testing import FakeHandler\nH = FakeHandler('Demo-Ping')\n", "H"
    )
    with pytest.raises(RegistryError) as info:
        default_registry()
    assert dist in str(info.value) and "Demo-Ping" in str(info.value)


@pytest.mark.parametrize(
    "name",
    ["files", "Files.write", "files.write.x.y", "1files.write", "files.write-x", "a..b", "", None],
)
def test_bad_effect_names_are_refused(name: object) -> None:
    """Names other than <integration>.<verb> or <integration>.<object>.<verb> are refused."""
    handler = FakeHandler("ok.ok")
    handler.name = name  # type: ignore[assignment]
    with pytest.raises(RegistryError) as info:
        Registry().register(handler, "plugin-x")
    assert str(info.value).startswith("plugin-x: ")
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("name", ["files.write", "github.pull_request.create", "s3.put_2"])
def test_good_effect_names_are_accepted(name: str) -> None:
    """Two- and three-part lower-case names register."""
    registry = Registry()
    registry.register(FakeHandler(name), "tests")
    assert name in registry


@pytest.mark.parametrize("method", ["check_config", "check", "reversible_for", "preview", "apply"])
def test_missing_method_is_refused(method: str) -> None:
    """A handler without one of the contract's methods is refused, naming origin and method."""
    handler = FakeHandler("demo.ping")
    setattr(handler, method, None)
    with pytest.raises(RegistryError) as info:
        Registry().register(handler, "plugin-x")
    assert "plugin-x" in str(info.value) and f"{method}()" in str(info.value)


@pytest.mark.parametrize(("flag", "value"), [("reversible", "yes"), ("idempotent", 1)])
def test_non_bool_flags_are_refused(flag: str, value: object) -> None:
    """reversible and idempotent must be real booleans, not truthy values."""
    handler = FakeHandler("demo.ping")
    setattr(handler, flag, value)
    with pytest.raises(RegistryError) as info:
        Registry().register(handler, "plugin-x")
    assert "plugin-x" in str(info.value) and f"demo.ping.{flag}" in str(info.value)


def test_missing_undo_sentence_is_refused() -> None:
    """A handler must say how its effect is undone."""
    handler = FakeHandler("demo.ping")
    handler.undo = None  # type: ignore[assignment]
    with pytest.raises(RegistryError, match=r"plugin-x: demo\.ping\.undo"):
        Registry().register(handler, "plugin-x")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "nope"},
        {"type": "object", "properties": {"x": {"minLength": -1}}},
        {"required": "path"},
    ],
)
def test_invalid_json_schema_is_refused(schema: dict[str, object]) -> None:
    """A schema that is not valid JSON Schema is refused at registration, naming origin."""
    with pytest.raises(RegistryError) as info:
        Registry().register(FakeHandler("demo.ping", schema=schema), "plugin-x")
    assert "plugin-x: demo.ping.schema" in str(info.value)
    assert "not a valid JSON Schema" in str(info.value)


def test_schema_that_is_not_an_object_is_refused() -> None:
    """A schema given as a list is refused."""
    handler = FakeHandler("demo.ping")
    handler.schema = ["type", "object"]  # type: ignore[assignment]
    with pytest.raises(RegistryError, match=r"plugin-x: demo\.ping\.schema"):
        Registry().register(handler, "plugin-x")


def test_refused_handler_is_not_registered() -> None:
    """After a refusal the name is still free for a correct handler."""
    registry = Registry()
    with pytest.raises(RegistryError):
        registry.register(FakeHandler("demo.ping", schema={"type": "nope"}), "bad")
    assert "demo.ping" not in registry
    registry.register(FakeHandler("demo.ping"), "good")
    assert registry.origin("demo.ping") == "good"


def test_unknown_effect_raises_unknown_effect() -> None:
    """Asking for a name nobody registered raises UnknownEffect naming it."""
    with pytest.raises(UnknownEffect, match=r"'nope\.nothing'"):
        default_registry().get("nope.nothing")
    with pytest.raises(UnknownEffect, match=r"did you mean 'http\.request'\?"):
        default_registry().get("http.requests")


def test_registry_lists_handlers_sorted() -> None:
    """Iteration yields handlers by name; reversibility maps each name to its flag."""
    registry = Registry()
    registry.register(FakeHandler("b.two", reversible=False), "tests")
    registry.register(FakeHandler("a.one"), "tests")
    assert [h.name for h in registry] == ["a.one", "b.two"]
    assert len(registry) == 2
    assert registry.reversibility() == {"a.one": True, "b.two": False}


def test_check_config_refuses_section_no_effect_belongs_to() -> None:
    """An [integrations.gitlab] section with no gitlab effect registered is refused."""
    with pytest.raises(ConfigError) as info:
        default_registry().check_config({"gitlab": {"token_env": "GITLAB_TOKEN"}})
    assert "integrations.gitlab" in str(info.value)
    assert "files" in str(info.value)


@pytest.mark.parametrize("root", ["/nonexistent/exports", 5, "a-file"])
def test_check_config_refuses_bad_files_root(root: object, tmp_path: Path) -> None:
    """files.root that is not an existing directory is refused, naming the key."""
    if root == "a-file":
        root = tmp_path / "a-file"
        root.write_text("")
        root = str(root)
    with pytest.raises(ConfigError, match=r"integrations\.files\.root"):
        default_registry().check_config({"files": {"root": root}})


def test_check_config_refuses_unknown_files_key(exports: Path) -> None:
    """A misspelt key under [integrations.files] is refused, naming it."""
    with pytest.raises(ConfigError, match=r"integrations\.files\.rot"):
        default_registry().check_config({"files": {"rot": str(exports)}})


def test_check_config_accepts_good_files_root(exports: Path) -> None:
    """An existing directory as files.root passes; so does no section at all."""
    registry = default_registry()
    registry.check_config({"files": {"root": str(exports)}})
    registry.check_config({})


PLUGIN_WITH_SCHEMA = """
from effects.base import Handler, Preview

class Ping(Handler):
    name = "demo.ping"
    reversible = True
    idempotent = True
    undo = "nothing to undo: a ping changes nothing"

    def preview(self, params, ctx):
        return Preview(title="ping", target="demo")

    def apply(self, params, ctx):
        return {"pong": params["n"]}
"""


def test_plugin_schema_beside_its_module_is_found(
    install_plugin: PluginMaker, tmp_path: Path
) -> None:
    """A third-party handler's schemas/<name>.json next to its module needs no override."""
    site = tmp_path / install_plugin(PLUGIN_WITH_SCHEMA, "Ping").removesuffix("_dist")
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    (site / "schemas").mkdir()
    (site / "schemas" / "demo.ping.json").write_text(json.dumps(schema))
    registry = default_registry()
    assert registry.effect("demo.ping").schema == schema


class _Minimal:
    """Only the contract's required members: no check, no reversible_for, no inline."""

    name = "demo.minimal"
    reversible = True
    idempotent = True
    undo = "nothing to undo"
    schema: ClassVar[dict[str, Any]] = {"type": "object"}

    def preview(self, params: Any, ctx: Any) -> Any:
        from broker.models import Preview

        return Preview(title="minimal", target="demo")

    def apply(self, params: Any, ctx: Any) -> dict[str, Any]:
        return {"ok": True}


def test_handler_with_only_required_members_gets_the_defaults() -> None:
    """Optional members absent: the registry resolves the contract's defaults."""
    registry = Registry()
    registry.register(_Minimal(), "plugin-x")
    effect = registry.effect("demo.minimal")
    ctx = make_context()
    assert effect.reversible_for({}, ctx) is True
    assert effect.idempotent_for({}, ctx) is True
    assert effect.inline is False
    assert effect.assess_inline is True  # no reversible_for of its own: nothing to ask
    assert effect.revertible is False
    effect.check({}, ctx)
    effect.check_config({"anything": 1})


def test_own_reversible_for_is_assessed_off_the_loop_unless_declared_local() -> None:
    """A handler with its own reversible_for may ask a service: off the loop by default."""
    remote = FakeHandler("demo.remote")
    remote.assess_inline = False
    registry = Registry()
    registry.register(remote, "plugin-x")
    registry.register(FakeHandler("demo.local"), "plugin-x")
    assert registry.effect("demo.remote").assess_inline is False
    assert registry.effect("demo.local").assess_inline is True


def test_minimal_handler_is_applied_by_a_real_broker(tmp_path: Path) -> None:
    """A plugin with only the required members is served end to end."""
    with BrokerHarness(tmp_path, handlers=[_Minimal()], builtins=False) as h:
        result = h.submit(h.request("demo.minimal"))
    assert result["status"] == "applied" and result["output"] == {"ok": True}


def test_revert_without_revert_preview_is_refused() -> None:
    """revert and revert_preview come together: undo always shows what it will do."""
    handler = _Minimal()
    handler.revert = lambda output, ctx: {}  # type: ignore[attr-defined]
    with pytest.raises(RegistryError, match=r"plugin-x: demo\.minimal must have both"):
        Registry().register(handler, "plugin-x")


def test_make_context_resolves_secrets_beside_the_config(tmp_path: Path) -> None:
    """make_context builds a real Context: a relative *_file secret is read beside broker.toml,
    and what a preview remembers reaches apply through a shared memo."""
    (tmp_path / "token.txt").write_text("s3cret\n")
    memo = Memo()
    ctx = make_context(
        {"token_file": "token.txt", "remotes": {"origin": {"token_file": "token.txt"}}},
        integration="demo",
        config_dir=tmp_path,
        memo=memo,
    )
    assert ctx.secret("token") == "s3cret"
    assert ctx.secret("remotes.origin.token") == "s3cret"
    assert ctx.secret("missing") is None
    ctx.remember({"etag": "abc"})
    later = make_context(integration="demo", memo=memo)
    assert later.recall() == {"etag": "abc"}
    assert make_context(integration="demo").recall() is None
