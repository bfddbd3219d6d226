"""Finding 1: policy rules on paths, keys, branches, repos and URLs match the canonical
params, the same ones that are recorded, hashed, shown and applied."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.models import canonical_json, sha256_hex
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness
from effects.netguard.urls import canonical_url
from tests.support import checked

PATH_POLICY = """
[[rules]]
effect = "files.write"
when = { path = ["*.sh", ".github/*", "bin/*"] }
action = "deny"
reason = "no scripts, CI or binaries"

[[rules]]
effect = "files.write"
when = { path = "deadline/*" }
action = "approve"
reason = "deadline files are reviewed"
"""


@pytest.fixture
def files_broker(tmp_path: Path) -> Iterator[BrokerHarness]:
    """A broker with files.write and the issue's path rules."""
    root = tmp_path / "exports"
    root.mkdir()
    with BrokerHarness(
        tmp_path / "h", policy=PATH_POLICY, integrations={"files": {"root": str(root)}}
    ) as h:
        yield h


def write(h: BrokerHarness, path: str, **extra: Any) -> dict[str, Any]:
    doc = h.request("files.write", {"path": path, "content": "#!/bin/sh\necho hi\n"}, **extra)
    return checked(h.submit(doc, terminal=False))


@pytest.mark.parametrize(
    "path",
    [
        "./.github/workflows/ci2.yml",
        ".github//workflows/ci.yml",
        "./bin/run2",
        "bin//run",
        "bin/./run",
        "evil3.sh/",
        "evil4.sh/.",
        "./evil5.sh",
        "a/../evil6.sh",
    ],
)
def test_non_canonical_paths_do_not_step_around_a_deny_rule(
    files_broker: BrokerHarness, path: str
) -> None:
    """Each spelling of a denied path is denied (or refused), and nothing is written."""
    result = write(files_broker, path)
    assert result["status"] in ("denied", "invalid"), result
    if result["status"] == "denied":
        assert "no scripts, CI or binaries" in result["reason"]
    root = files_broker.base.parent / "exports"
    assert [p for p in root.rglob("*") if p.is_file()] == []


def test_a_non_canonical_path_still_waits_for_its_approval(files_broker: BrokerHarness) -> None:
    """`./deadline/y.txt` is the approve rule's `deadline/y.txt`: it waits for a person."""
    result = write(files_broker, "./deadline/y.txt")
    assert result["status"] == "pending"
    assert "deadline files are reviewed" in result["reason"]


def test_what_is_recorded_and_hashed_is_the_canonical_request(files_broker: BrokerHarness) -> None:
    """The ledger keeps the canonical params, the result's sha256 is theirs, and the
    output names the canonical path the agent can use next time."""
    doc = files_broker.request("files.write", {"path": "notes//./a.txt/", "content": "x"})
    result = checked(files_broker.submit(doc))
    assert result["status"] == "applied"
    assert result["output"]["path"] == "notes/a.txt"
    canonical_env = {**doc, "params": {"path": "notes/a.txt", "content": "x"}}
    assert result["request_sha256"] == sha256_hex(canonical_json(canonical_env))
    ledger = Ledger(files_broker.config.ledger_path)
    try:
        record = ledger.get(files_broker.sandbox, doc["id"])
        assert record is not None
        assert json.loads(record.payload or "{}")["params"]["path"] == "notes/a.txt"
    finally:
        ledger.close()


def test_two_spellings_with_one_idempotency_key_are_one_request(
    files_broker: BrokerHarness,
) -> None:
    """`a.txt` then `./a.txt` with the same key: the same canonical payload, a replay."""
    first = files_broker.request("files.write", {"path": "a.txt", "content": "x"})
    second = files_broker.request("files.write", {"path": "./a.txt", "content": "x"})
    one = checked(files_broker.submit({**first, "idempotency_key": "k"}))
    two = checked(files_broker.submit({**second, "idempotency_key": "k"}))
    assert one["status"] == two["status"] == "applied"
    assert two.get("replayed") is True


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("caf\u0065\u0301/menu.txt", "NFC"),
        ("/etc/passwd", "relative"),
        ("a/\x1b[31m.txt", "control"),
        (".", "names no file"),
    ],
)
def test_paths_with_no_single_meaning_are_refused(
    files_broker: BrokerHarness, path: str, why: str
) -> None:
    """Decomposed Unicode, absolute paths, control characters and nothing are `invalid`."""
    result = write(files_broker, path)
    assert result["status"] == "invalid"
    assert why in result["reason"]
    assert result["errors"][0]["path"] == "/params/path"


OTHER_POLICY = """
[[rules]]
effect = "github.*"
when = { repo = "acme/prod" }
action = "deny"
reason = "production is off limits"

[[rules]]
effect = "http.request"
when = { url = "https://api.example.com/admin/*" }
action = "deny"
reason = "no admin calls"

[[rules]]
effect = "git.push"
when = { branch = "agent/*" }
action = "auto"
reason = "agent branches"
"""


@pytest.fixture
def other_broker(tmp_path: Path) -> Iterator[BrokerHarness]:
    """A broker with the built-in github, http and git effects and rules on each."""
    with BrokerHarness(
        tmp_path / "h",
        policy=OTHER_POLICY,
        integrations={"git": {"remotes": {"origin": {"url": str(tmp_path / "none.git")}}}},
    ) as h:
        yield h


@pytest.mark.parametrize("repo", ["ACME/prod", "acme/PROD", "Acme/Prod"])
def test_github_repositories_are_matched_case_insensitively(
    other_broker: BrokerHarness, repo: str
) -> None:
    """GitHub names repositories case-insensitively, so the rule on acme/prod holds."""
    doc = other_broker.request("github.issue.comment", {"repo": repo, "number": 1, "body": "hi"})
    result = checked(other_broker.submit(doc))
    assert result["status"] == "denied"
    assert "production is off limits" in result["reason"]


@pytest.mark.parametrize(
    "url",
    [
        "https://API.Example.COM/admin/users",
        "https://api.example.com./admin/users",
        "https://api.example.com:443/admin/users",
        "https://api.example.com//admin/users",
        "https://api.example.com/%61dmin/users",
        "https://api.example.com/public/../admin/users",
        "https://api.example.com/./admin/users#x",
    ],
)
def test_urls_are_matched_in_their_canonical_form(other_broker: BrokerHarness, url: str) -> None:
    """Case, a trailing dot, the default port, `//`, `%61`, dot segments and fragments do
    not step around a rule on the URL."""
    doc = other_broker.request("http.request", {"method": "DELETE", "url": url})
    result = checked(other_broker.submit(doc))
    assert result["status"] == "denied", result
    assert "no admin calls" in result["reason"]


def test_encoded_dot_segments_in_a_url_are_refused(other_broker: BrokerHarness) -> None:
    """`%2e%2e` may be read as `..` by a server: the request is `invalid`."""
    doc = other_broker.request(
        "http.request", {"method": "GET", "url": "https://api.example.com/public/%2e%2e/admin/x"}
    )
    result = checked(other_broker.submit(doc))
    assert result["status"] == "invalid"
    assert "encoded" in result["reason"]


def test_a_unicode_look_alike_host_is_shown_as_punycode() -> None:
    """A Cyrillic `а` in the host is canonical as its IDNA form, which no rule confuses."""
    assert canonical_url("https://\u0430pi.example.com/x") == "https://xn--pi-6kc.example.com/x"


@pytest.mark.parametrize(
    "branch", ["agent//x", "agent/./x", "refs/heads/agent/x", "agent/.hidden", "agent/x.lock"]
)
def test_branches_with_another_spelling_are_refused(
    other_broker: BrokerHarness, branch: str
) -> None:
    """A branch that git would read differently from how the rule reads it is `invalid`."""
    doc = other_broker.request(
        "git.push",
        {"remote": "origin", "branch": branch, "bundle": "b", "expected_old": None},
        attachments=["b"],
    )
    other_broker.write(f"{doc['id']}.b.bin", b"not a bundle")
    result = checked(other_broker.submit(doc))
    assert result["status"] == "invalid"
    assert result["errors"][0]["path"] == "/params/branch"


def test_s3_keys_with_two_spellings_are_refused(tmp_path: Path) -> None:
    """`a//b` and decomposed Unicode are refused before any rule or service sees them."""
    settings = {"s3": {"allow": ["scratch/*"], "endpoint_url": "http://127.0.0.1:9"}}
    with BrokerHarness(tmp_path / "h", integrations=settings) as h:
        for key in ("reports//x.txt", "caf\u0065\u0301.txt"):
            doc = h.request("s3.put_object", {"bucket": "scratch", "key": key, "body": "x"})
            result = checked(h.submit(doc))
            assert result["status"] == "invalid", key
            assert result["errors"][0]["path"] == "/params/key"
