"""docs/architecture.md's example handler is real: it registers, previews, waits for a
person (it is irreversible), and is applied with the host's secret once approved; and
the doc's examples pass `mypy --strict` as a plugin author's project would run it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import mypy.api
import pytest

from broker.approval.decisions import Ballot, decide_and_wake
from broker.errors import ConfigError
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, make_context

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
# kept across runs (mypy checks each cached module against its source): the stdlib's and
# the broker's analysis is then read, not redone (11 s → 2 s from the second run on)
CACHE = Path(__file__).resolve().parents[1] / ".mypy_cache" / "doc-example"


def blocks() -> list[str]:
    """The doc's Python blocks, in order."""
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def example() -> dict[str, Any]:
    """The doc's first Python block, executed: its names."""
    code = blocks()[0]
    assert len(code.strip().splitlines()) < 40, "the example handler must stay under 40 lines"
    names: dict[str, Any] = {}
    exec(compile(code, str(DOC), "exec"), names)
    return names


def test_the_example_handler_works_through_a_real_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Registered, it waits for a person, shows its literal message, and applies once approved."""
    monkeypatch.setenv("PAGER_TOKEN", "s3cret-token")
    ping = example()["Ping"]()
    settings = {"pager": {"channel": "#ops", "token_env": "PAGER_TOKEN"}}
    with BrokerHarness(tmp_path, handlers=[ping], integrations=settings) as h:
        doc = h.request("pager.ping", {"message": "disk full on db-1"})
        waiting = h.submit(doc, terminal=False)
        ledger = Ledger(h.config.ledger_path)
        try:
            recorded = ledger.get("default", doc["id"])
            assert recorded is not None and recorded.preview is not None
            card_body = recorded.preview
            decide_and_wake(
                h.config,
                ledger,
                Ballot(
                    doc["id"], "approve", approver="ops", reason="ok", surface="cli", sha256=None
                ),
            )
        finally:
            ledger.close()
        done = h.wait(doc["id"])
    assert waiting["status"] == "pending"
    assert card_body["body"] == "disk full on db-1"
    assert done["status"] == "applied" and done["output"] == {"paged": "#ops", "with": "True"}


def test_the_example_handler_refuses_a_config_without_its_token() -> None:
    """check_config names the key at fault."""
    with pytest.raises(ConfigError, match=r"integrations\.pager\.token_env"):
        example()["Ping"]().check_config({"channel": "#ops"})


def test_the_doc_s_make_context_line_holds() -> None:
    """The doc's make_context snippet previews as it says."""
    ctx = make_context({"channel": "#ops", "token_env": "PAGER_TOKEN"}, integration="pager")
    assert example()["Ping"]().preview({"message": "disk full"}, ctx).body == "disk full"


def test_the_doc_s_examples_pass_mypy_strict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The doc's Python blocks, as one plugin module outside this tree, type-check with
    `mypy --strict`: `broker` and `effects` are found installed, typed (py.typed)."""
    plugin = tmp_path / "pager_plugin.py"
    plugin.write_text("\n".join(blocks()), encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # no pyproject.toml, and this tree is not on mypy's path
    out, err, status = mypy.api.run(["--strict", "--cache-dir", str(CACHE), str(plugin)])
    assert status == 0, out + err
    assert "no issues found in 1 source file" in out
