"""An agent that keeps replacing a request under the same name and id while the broker
reads it, from a real container: one version is applied whole, once, and every other
version the broker saw is on record as a reused id. (Single rewrites and in-place edits
after the read are in tests/test_intake.py; an id reused with other bytes in
tests/test_pipeline.py.)"""

from __future__ import annotations

import hashlib

import pytest

from broker.audit import verify as audit
from broker.models import canonical_json
from tests.hostile.conftest import FIGURES, HostileHost

REWRITE = r"""
import json, os, sys, time
versions = int(sys.argv[1])
for v in range(versions):
    doc = {"version": 1, "id": "same", "effect": "test.record",
           "params": {"value": f"version-{v:05d}-" + "x" * (v % 97)}}
    with open("/outbox/.same.tmp", "w") as f:
        f.write(json.dumps(doc))
    os.rename("/outbox/.same.tmp", "/outbox/same.json")
print(json.dumps({"versions": versions}))
"""


@pytest.mark.docker
def test_request_replaced_in_a_loop_is_applied_once_and_whole(host: HostileHost) -> None:
    """A request renamed over itself 2,000 times is applied once, whole, as one written version."""
    paths = host.sandbox()
    host.start()
    ran = host.run(paths, REWRITE, "2000")
    assert ran.code == 0, ran.stderr

    result = host.wait_results(paths, ["same"])["same"]
    host.still_serving(paths)

    assert result["status"] == "applied"
    applied = [a for a in host.record.applied if a["value"].startswith("version-")]
    assert len(applied) == 1, f"applied {len(applied)} versions of one id"
    value = applied[0]["value"]
    v = int(value.split("-")[1])
    assert value == f"version-{v:05d}-" + "x" * (v % 97), "a torn version was applied"
    doc = {"version": 1, "id": "same", "effect": "test.record", "params": {"value": value}}
    assert result["request_sha256"] == hashlib.sha256(canonical_json(doc)).hexdigest()
    events = [e for _, e, _ in audit.read_events(host.state / "audit.jsonl") if e]
    reused = [e for e in events if e["event"] == "duplicate_id" and e["id"] == "same"]
    received = [e for e in events if e["event"] == "received" and e["id"] == "same"]
    assert len(received) == 1
    assert len({e["sha256"] for e in reused}) == len(reused), "one version audited twice"
    assert result["request_sha256"] not in {e["sha256"] for e in reused}
    assert not (paths.outbox / "same.json").exists()
    FIGURES["rewrite"] = (
        f"rewrite race: 2000 versions of one request, {1 + len(reused)} seen by the broker, "
        "1 applied whole"
    )
