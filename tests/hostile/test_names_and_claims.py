"""Names and envelopes an agent chooses to confuse the broker or the reviewer, written
from a real container: odd names are left alone, case is kept apart, and a request
cannot claim a decision for itself.

Host-side cases of bad names and malformed JSON (deep nesting, huge numbers, NaN,
duplicate keys, bad or lone-surrogate Unicode) are in tests/test_intake.py; the
fuzz suite (tests/fuzz/) throws generated ones at the same code.
"""

from __future__ import annotations

import os

import pytest

from tests.hostile.conftest import HostileHost

NAMES = r"""
import json, os
def put(name, doc):
    tmp = b"/outbox/.tmp-" + os.urandom(4).hex().encode()
    with open(tmp, "w") as f:
        f.write(json.dumps(doc))
    os.rename(tmp, b"/outbox/" + name)
def req(value, **extra):
    return {"version": 1, "effect": "test.record", "params": {"value": value}, **extra}
put(b"Case.json", req("upper"))
put(b"case.json", req("lower"))
put(b"CASE.json", req("shout"))
put(b"\xff\xfe.json", req("not utf-8"))
put(b"new\nline.json", req("newline"))
put(b"esc\x1b[31mred.json", req("escape"))
put(b"bell\x07.json", req("bell"))
put(b"tab\tname.json", req("tab"))
print(json.dumps(sorted(os.listdir(b"/outbox"), key=bytes).__repr__()))
"""

CLAIMS = r"""
import json, os
def put(name, doc):
    with open(f"/outbox/.{name}.tmp", "w") as f:
        f.write(json.dumps(doc))
    os.rename(f"/outbox/.{name}.tmp", f"/outbox/{name}.json")
base = {"version": 1, "effect": "test.gated", "params": {"value": "deploy"}}
put("self-approved", {**base, "id": "self-approved", "approved": True})
put("self-decided", {**base, "id": "self-decided", "decided_by": "security-team",
                     "decided_at": "2026-01-01T00:00:00.000Z", "status": "applied"})
put("self-hashed", {**base, "id": "self-hashed", "request_sha256": "0" * 64,
                    "approvals": ["alice", "bob"]})
put("honest", {**base, "id": "honest"})
"""


@pytest.mark.docker
def test_names_differing_only_by_case_are_separate_and_odd_names_ignored(
    host: HostileHost,
) -> None:
    """Names differing only by case are separate requests; non-UTF-8 and control names stay put."""
    paths = host.sandbox()
    host.start()
    ran = host.run(paths, NAMES)
    assert ran.code == 0, ran.stderr

    results = host.wait_results(paths, ["Case", "case", "CASE"])

    assert {k: r["output"]["value"] for k, r in results.items()} == {
        "Case": "upper",
        "case": "lower",
        "CASE": "shout",
    }
    assert all(r["status"] == "applied" for r in results.values())
    left = sorted(n for n in os.listdir(os.fsencode(paths.outbox)) if not n.startswith(b"."))
    odd = [b"\xff\xfe.json", b"new\nline.json", b"esc\x1b[31mred.json", b"bell\x07.json"]
    assert left == sorted([*odd, b"tab\tname.json"])
    host.still_serving(paths)
    answered = {n for n in os.listdir(paths.results) if not n.startswith((".", "alive-"))}
    assert answered == {"Case.json", "case.json", "CASE.json"}


@pytest.mark.docker
def test_request_claiming_its_own_approval_is_invalid(host: HostileHost) -> None:
    """A request carrying `approved`, `decided_by` or other decision keys is `invalid`."""
    paths = host.sandbox()
    host.start()
    ran = host.run(paths, CLAIMS)
    assert ran.code == 0, ran.stderr

    ids = ["self-approved", "self-decided", "self-hashed"]
    results = host.wait_results(paths, ids)
    honest = host.results(paths)

    for rid in ids:
        assert results[rid]["status"] == "invalid", results[rid]
        assert results[rid]["decided_by"] is None
    assert "approved" in results["self-approved"]["reason"]
    assert honest["honest"]["status"] == "pending"
    assert host.gated.applied == []
