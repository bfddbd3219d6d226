"""Every example in the docstrings a plugin author reads runs, and holds what it says.

An example is an indented block of a docstring that starts with an import; it runs
as written, with `tmp_path` (and, for broker.client, a running broker and the `ref` of
a request waiting for a person) given. Top-level `await` runs in an event loop."""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from broker.testing import BrokerHarness, FakeHandler
from tests.support import SETTLE_S

MODULES = {"broker.testing": 1, "broker.client": 1, "effects.base": 1, "broker.typing": 0}
"""Each module a plugin author reads, and how many examples its docstrings hold."""


def docstrings(module: str) -> Iterator[tuple[str, str]]:
    """(where, docstring) for the module and each class and function in it."""
    source = inspect.getsource(importlib.import_module(module))
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node)
            if text:
                yield (module if isinstance(node, ast.Module) else f"{module}.{node.name}", text)


def examples(module: str) -> list[tuple[str, str]]:
    """The indented blocks that start with an import, dedented: (where, code)."""
    found: list[tuple[str, str]] = []
    for where, text in docstrings(module):
        block: list[str] = []
        for line in [*text.splitlines(), "end"]:
            if line.startswith("    ") or (block and not line.strip()):
                block.append(line)
                continue
            code = textwrap.dedent("\n".join(block)).strip()
            if code.startswith(("from ", "import ")):
                found.append((where, code + "\n"))
            block = []
    return found


ALL = [(module, where, code) for module in MODULES for where, code in examples(module)]


def test_each_module_holds_the_examples_it_should() -> None:
    """The examples found are the ones expected: a reformatted one is not silently skipped."""
    counted = {module: sum(1 for m, _, _ in ALL if m == module) for module in MODULES}
    assert counted == MODULES


@contextmanager
def given(module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The names an example's prose assumes. For broker.client: a running broker found by
    $BROKER_STATE_DIR, and the `ref` of a request that waits for a person."""
    if module != "broker.client":
        yield {"tmp_path": tmp_path}
        return
    policy = '[[rules]]\neffect = "demo.send"\naction = "approve"\ntimeout = "1h"\n'
    harness = BrokerHarness(
        tmp_path / "broker", handlers=[FakeHandler("demo.send")], policy=policy, builtins=False
    )
    monkeypatch.delenv("BROKER_CONFIG", raising=False)
    monkeypatch.setenv("BROKER_STATE_DIR", str(harness.state))
    with harness as h:
        time.sleep(SETTLE_S)
        waiting = h.submit(h.request("demo.send", {"value": "v"}), terminal=False)
        assert waiting["status"] == "pending", waiting
        yield {"ref": waiting["id"]}
        done = h.wait(waiting["id"])
        assert (done["status"], done["decided_by"]) == ("applied", "chatbot:alice")


@pytest.mark.parametrize(("module", "where", "code"), ALL, ids=[where for _, where, _ in ALL])
def test_the_docstring_example_runs(
    module: str, where: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example runs as written and its own asserts hold (broker.client's approval is
    then applied by the broker)."""
    monkeypatch.chdir(tmp_path)
    compiled = compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    with given(module, tmp_path, monkeypatch) as names:
        if compiled.co_flags & inspect.CO_COROUTINE:
            asyncio.run(eval(compiled, names))
        else:
            exec(compiled, names)
    if module == "effects.base":
        assert {"Handler", "Context", "Preview", "EffectFailed", "InvalidParams"} <= set(names)
