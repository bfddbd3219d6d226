"""The effect catalogue the broker publishes into each results dir, code.execute's
card, and a policy rule on a block's language (no Docker: a broker in a thread)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from broker.loop.catalogue import CATALOGUE_NAME
from broker.testing import BrokerHarness
from tests.integrations.conftest import CLIENT

POLICY = """
[[rules]]
effect = "code.execute"
when = { "blocks.language" = "python" }
action = "auto"
reason = "python blocks are fine"

[[rules]]
effect = "files.write"
when = { overwrite = true }
action = "approve"
approvals = 2
timeout = "4h"
reason = "an overwrite destroys the old file"
"""


def harness(tmp_path: Path) -> BrokerHarness:
    exports = tmp_path / "exports"
    exports.mkdir()
    return BrokerHarness(
        tmp_path / "h", policy=POLICY, integrations={"files": {"root": str(exports)}}
    )


def test_catalogue_is_published_read_only_with_what_approval_may_ask(tmp_path: Path) -> None:
    """Serving an outbox writes .effects.json (0644, not a result name): every effect,
    its schema and flags, and the rules that may decide it."""
    with harness(tmp_path) as h:
        path = h.results / CATALOGUE_NAME
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        doc = json.loads(path.read_bytes())
        by_name = {e["name"]: e for e in doc["effects"]}
        assert sorted(by_name) == sorted(x.name for x in h.registry)
        files = by_name["files.write"]
        assert files["params_schema"] == dict(h.registry.get("files.write").schema)
        assert (files["reversible"], files["idempotent"]) == (True, True)
        assert files["approval"]["summary"] == (
            "when overwrite = true: waits for 2 people to approve (up to 4h, then denied); "
            "when it can be undone: applied at once; "
            "when it cannot be undone: waits for 1 person to approve (up to 1h, then denied)"
        )
        code = by_name["code.execute"]["approval"]
        assert code["rules"][0] == {
            "rule": "rules[0]",
            "when": {"blocks.language": "python"},
            "action": "auto",
            "reason": "python blocks are fine",
        }
        assert code["summary"].endswith(
            "otherwise: waits for 1 person to approve (up to 1h, then denied)"
        )


def test_outbox_effects_reads_the_catalogue(tmp_path: Path) -> None:
    """`outbox effects --json` in the sandbox's environment prints the same catalogue."""
    with harness(tmp_path) as h:
        env = {**os.environ, "OUTBOX_DIR": str(h.outbox), "RESULTS_DIR": str(h.results)}
        done = subprocess.run(
            [sys.executable, str(CLIENT), "effects", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        published = json.loads((h.results / CATALOGUE_NAME).read_bytes())["effects"]
        assert json.loads(done.stdout) == published
        missing = subprocess.run(
            [sys.executable, str(CLIENT), "effects", "no.such"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert missing.returncode == 2
        assert missing.stderr.strip() == (
            "outbox: error: no effect named 'no.such'; `outbox effects` lists them"
        )


def test_a_rule_on_block_language_needs_every_block_to_match(tmp_path: Path) -> None:
    """python-only blocks are auto-approved; one shell block among them waits for a person,
    whose card shows each block's literal code and the conversation."""
    with harness(tmp_path) as h:
        python = h.submit(
            h.request("code.execute", {"blocks": [{"language": "python", "code": "print(1)"}]})
        )
        assert python["status"] == "applied"
        assert python["output"] == {
            "approved_blocks": 1,
            "languages": ["python"],
            "runs_in": "sandbox",
        }
        mixed = h.request(
            "code.execute",
            {
                "blocks": [
                    {"language": "python", "code": "print(1)\n"},
                    {"language": "sh", "code": "rm -rf /workspace/*\n"},
                ],
                "context": [{"source": "user", "content": "clean up the workspace"}],
            },
        )
        pending = h.submit(mixed, terminal=False)
        assert pending["status"] == "pending"
        assert h.broker is not None
        record = h.broker.ledger.get(h.sandbox, mixed["id"])
        assert record is not None and record.preview is not None
        body = record.preview["body"]
        assert (
            "block 1 of 2: python, 1 line(s)\n│ print(1)\n\n"
            "block 2 of 2: sh, 1 line(s)\n│ rm -rf /workspace/*"
        ) in body
        assert "[user] clean up the workspace" in body
        assert "the agents' words, not checked" in body


def test_code_execute_params_are_checked(tmp_path: Path) -> None:
    """No blocks, or a block without code, is invalid with the schema's errors."""
    with harness(tmp_path) as h:
        empty = h.submit(h.request("code.execute", {"blocks": []}))
        assert empty["status"] == "invalid"
        assert empty["errors"][0]["path"] == "/params/blocks"
        nocode = h.submit(h.request("code.execute", {"blocks": [{"language": "python"}]}))
        assert nocode["status"] == "invalid"
        assert "'code' is required" in nocode["errors"][0]["message"]
