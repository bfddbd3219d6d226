"""A broker imports only the handlers it uses: effects named by their entry point load
when first asked for, and the effect catalogue comes from what the handlers declared,
kept in the state dir until a handler's files change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.errors import RegistryError
from broker.loop import catalogue
from broker.policy.ruleset import Policy
from broker.registry import default_registry

PLUGIN = '''
from effects.base import Handler, Preview

class Note(Handler):
    """notes.add: keep a note."""

    name = "notes.add"
    reversible = True
    idempotent = True
    undo = "UNDO"
    schema = {"type": "object"}

    def preview(self, params, ctx):
        return Preview(title="note", target="notes")

    def apply(self, params, ctx):
        return {}
'''

Install = Callable[[str, str], str]


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Install:
    """A distribution with one entry point named `ep_name` pointing at `target`."""

    def make(source: str, ep_name: str, target: str = "Note") -> str:
        module = f"lazy_{uuid.uuid4().hex[:10]}"
        site = tmp_path / module
        info = site / f"{module}-1.0.dist-info"
        info.mkdir(parents=True)
        (site / f"{module}.py").write_text(source)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[broker.effects]\n{ep_name} = {module}:{target}\n")
        monkeypatch.syspath_prepend(str(site))
        return module

    return make


def test_builtin_handlers_load_only_when_asked_for() -> None:
    """Making the registry imports no handler; asking for an effect loads its handler."""
    code = (
        "import sys; from broker.registry import default_registry\n"
        "r = default_registry()\n"
        "print(len(r), 'effects.github' in sys.modules, 'effects.s3' in sys.modules)\n"
        "r.effect('github.issue.create')\n"
        "print('effects.github' in sys.modules, 'effects.s3' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["14", "False", "False", "True", "False"]


def test_client_libraries_load_with_the_first_call_not_with_the_handlers() -> None:
    """Every handler loaded (as `broker effects`, a policy check and a start do) imports
    no service client and not the stdlib's schema validator: PyGithub and boto3 load
    with the first call that needs them, jsonschema with the first refusal to explain."""
    clients = ("github", "requests", "jwt", "boto3", "botocore", "jsonschema")
    code = (
        "import sys; from broker.registry import default_registry\n"
        "r = default_registry(); r.schemas(); r.effects()\n"
        f"print(*[m for m in {clients!r} if m in sys.modules])\n"
        "from effects.github.errors import github_reasons; github_reasons()\n"
        "from effects.s3.clients import _make_clients\n"
        "_make_clients('http://127.0.0.1:9', 'us-east-1', 'path', None, None, None)\n"
        "print('github' in sys.modules, 'boto3' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, called = done.stdout.splitlines()
    assert loaded.split() == []
    assert called.split() == ["True", "True"]


def test_a_lazy_entry_point_must_give_the_effect_it_is_named_for(install: Install) -> None:
    """An entry point named `notes.remove` that gives `notes.add` is refused, naming it."""
    module = install(PLUGIN, "notes.remove")
    registry = default_registry()
    assert "notes.remove" in registry
    with pytest.raises(RegistryError, match=rf"{module}.*named 'notes.add'"):
        registry.effect("notes.remove")


def test_the_catalogue_is_built_from_kept_facts_until_a_handler_changes(
    install: Install, tmp_path: Path
) -> None:
    """With the facts kept, publishing the catalogue imports no handler; edit the
    handler's module and the catalogue shows the change."""
    module = install(PLUGIN, "notes.add")
    cache = tmp_path / "state" / "effects.cache"
    first = catalogue.build(default_registry(), Policy(), cache)
    assert module in sys.modules  # the first build asked the handler
    del sys.modules[module]
    again = catalogue.build(default_registry(), Policy(), cache)
    assert module not in sys.modules, "a kept catalogue imported the handler"
    assert again == first
    path = tmp_path / module / f"{module}.py"
    path.write_text(PLUGIN.replace('"UNDO"', '"CHANGED"'))
    os.utime(path, ns=(path.stat().st_mtime_ns + 10**9,) * 2)
    changed = catalogue.build(default_registry(), Policy(), cache)
    note = next(e for e in changed["effects"] if e["name"] == "notes.add")
    assert note["undo"] == "CHANGED"
    assert json.loads(cache.read_text())["notes.add"]["facts"]["undo"] == "CHANGED"


def test_the_facts_are_kept_in_the_user_s_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One cache per user for every state dir: $XDG_CACHE_HOME/broker, else ~/.cache/broker."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert catalogue.facts_cache() == tmp_path / "xdg" / "broker" / "effect-facts.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert catalogue.facts_cache() == tmp_path / "home" / ".cache" / "broker" / "effect-facts.json"


def test_serve_without_github_loads_no_http_client() -> None:
    """What `broker serve` imports to start, its pull request cards included, loads no
    HTTP client: httpx comes with the GitHub thread's client, when [integrations.github]
    asks for one (the GitHub approval tests make those calls)."""
    code = (
        "import sys; import broker.cli.serve, broker.integrations.github_cards\n"
        "print('httpx' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False"]
