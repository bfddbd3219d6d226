"""`broker policy replay` over a ledger built by real broker runs: 205 requests (200 that
reached the policy) across files.write and http.request (against a loopback server),
some applied by the policy, some decided by people (the real CLI and approval API),
some denied, five invalid; then policies that loosen, tighten and change nothing."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from broker.approval.decisions import Ballot, decide_and_wake
from broker.review.replay import LOOSENED_EXIT
from broker.store.sqlite import SQLiteStore
from broker.testing import BrokerHarness
from tests.support import run_broker

OLD = """
[[rules]]
effect = "files.write"
when = { path = "deny/*" }
action = "deny"
reason = "nothing goes under deny/"

[[rules]]
effect = "files.write"
when = { path = "gate/*" }
action = "approve"
reason = "a person reads gate/ first"

[[rules]]
effect = "http.request"
when = { method = "POST" }
action = "approve"
reason = "posts wait for a person"
"""
# the gate rule gone (25 of its 30 apply unseen; 5 touch protected paths), deny/ → approve
LOOSER = OLD.replace(
    'when = { path = "gate/*" }\naction = "approve"', 'when = { path = "gate/*" }\naction = "auto"'
).replace(
    'when = { path = "deny/*" }\naction = "deny"', 'when = { path = "deny/*" }\naction = "approve"'
)
# GETs wait for a person too
TIGHTER = (
    OLD
    + """
[[rules]]
effect = "http.request"
when = { method = "GET" }
action = "approve"
reason = "every call waits for a person"
"""
)


class Calls(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append((self.command, self.path))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_calls() -> Iterator[ThreadingHTTPServer]:
    """A loopback HTTP server recording (method, path) of each call in `.seen`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Calls)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture(scope="module")
def api() -> Iterator[ThreadingHTTPServer]:
    yield from serve_calls()


def integrations(exports: Path, api: ThreadingHTTPServer) -> dict[str, Any]:
    port = api.server_address[1]
    return {
        "files": {"root": str(exports), "protected_paths": ["gate/protected-*"]},
        "http": {
            "allow_networks": ["127.0.0.0/8"],
            "destinations": {"api": {"base_url": f"http://127.0.0.1:{port}"}},
        },
    }


def toml_config(base: Path, exports: Path, api: ThreadingHTTPServer) -> Path:
    """A broker.toml for the CLI over the same state dir and integrations."""
    port = api.server_address[1]
    path = base / "broker.toml"
    path.write_text(
        f'[broker]\nstate_dir = "{base / "h" / "state"}"\npolicy = "{base / "old.toml"}"\n'
        f'[integrations.files]\nroot = "{exports}"\nprotected_paths = ["gate/protected-*"]\n'
        f'[integrations.http]\nallow_networks = ["127.0.0.0/8"]\n'
        f'[integrations.http.destinations.api]\nbase_url = "http://127.0.0.1:{port}"\n'
    )
    return path


def files(h: BrokerHarness, path: str) -> dict[str, Any]:
    return h.submit(h.request("files.write", {"path": path, "content": "x"}), terminal=False)


def call(h: BrokerHarness, method: str, n: int) -> dict[str, Any]:
    params = {"method": method, "destination": "api", "path": f"/items/{n}"}
    if method == "POST":
        params["json"] = {"n": n}
    return h.submit(h.request("http.request", params), terminal=False)


@pytest.fixture(scope="module")
def site(
    tmp_path_factory: pytest.TempPathFactory, api: ThreadingHTTPServer, home: Path
) -> dict[str, Any]:
    """The history, built once: sandbox `default` (files.write, 130 + 5 invalid) and
    sandbox `other` (http.request, 70)."""
    base = tmp_path_factory.mktemp("replay")
    exports = base / "exports"
    exports.mkdir()
    (base / "old.toml").write_text(OLD)
    config = toml_config(base, exports, api)
    h = BrokerHarness(base / "h", policy=OLD, integrations=integrations(exports, api))
    gated: list[str] = []
    with h:
        for n in range(80):
            assert files(h, f"auto/{n}.txt")["status"] == "applied"
        for n in range(25):
            gated.append(files(h, f"gate/{n}.txt")["id"])
        for n in range(5):
            gated.append(files(h, f"gate/protected-{n}.txt")["id"])
        for n in range(20):
            assert files(h, f"deny/{n}.txt")["status"] == "denied"
        for n in range(5):
            bad = h.request("files.write", {"path": f"bad/{n}.txt"})  # no content: invalid
            assert h.submit(bad)["status"] == "invalid"
        for rid in gated[:5]:  # people decide: five with the real CLI
            done = run_broker("approve", rid, "--yes", "--config", str(config), home=home)
            assert done.returncode == 0, done.stderr
        ledger = SQLiteStore(h.state / "ledger.sqlite3")
        for rid in gated[5:20]:
            decide_and_wake(
                h.config,
                ledger,
                Ballot(rid, "approve", approver="bob", reason=None, surface="api", sha256=None),
            )
        for rid in gated[20:]:
            decide_and_wake(
                h.config,
                ledger,
                Ballot(rid, "deny", approver="bob", reason="no", surface="api", sha256=None),
            )
        for rid in gated[:20]:
            assert h.wait(rid)["status"] == "applied"
    h.sandbox = "other"
    with h:
        for n in range(50):
            assert call(h, "GET", n)["status"] == "applied"
        for n in range(20):
            assert call(h, "POST", n)["status"] == "pending"
    # the GETs were received 40 days ago (for --since)
    db = sqlite3.connect(h.state / "ledger.sqlite3")
    with db:
        db.execute(
            "UPDATE requests SET received_at = '2000-01-01T00:00:00.000Z' "
            "WHERE effect = 'http.request' AND payload LIKE '%\"GET\"%'"
        )
    db.close()
    for name, text in (("same.toml", OLD), ("looser.toml", LOOSER), ("tighter.toml", TIGHTER)):
        (base / name).write_text(text)
    return {"base": base, "config": config, "ledger": ledger}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


def replay(site: dict[str, Any], home: Path, policy: str, *args: str) -> tuple[int, dict[str, Any]]:
    done = run_broker(
        "policy",
        "replay",
        str(site["base"] / policy),
        "--json",
        *args,
        "--config",
        str(site["config"]),
        home=home,
    )
    assert "Traceback" not in done.stderr
    return done.returncode, json.loads(done.stdout)


def test_the_same_policy_changes_nothing(site: dict[str, Any], home: Path) -> None:
    code, report = replay(site, home, "same.toml")
    assert code == 0
    assert report["replayed"] == 200
    assert report["skipped"] == {"invalid": 5}
    assert report["changed"] == 0 and report["changes"] == []
    assert report["by_effect"] == {
        "files.write": {"unchanged": 130},
        "http.request": {"unchanged": 70},
    }
    # people: 30 gate/ files and 20 posts of 200
    assert report["approval_rate"] == {
        "before": 0.25,
        "after": 0.25,
        "before_count": 50,
        "after_count": 50,
    }
    assert report["without_facts"] == 0


def test_a_looser_policy_lists_what_would_apply_unseen_first_and_exits_3(
    site: dict[str, Any], home: Path
) -> None:
    code, report = replay(site, home, "looser.toml")
    assert code == LOOSENED_EXIT == 3
    assert report["changed"] == 45
    assert report["loosened"] == 45 and report["tightened"] == 0
    # the five protected ones still wait: their recorded facts say they touch gate/protected-*
    assert report["unattended"] == 25
    assert report["by_effect"]["files.write"] == {
        "approve→auto": 25,
        "deny→approve": 20,
        "unchanged": 85,
    }
    first = report["changes"][:25]
    assert all(c["change"] == "approve→auto" and c["unattended"] for c in first)
    assert {c["target"]["path"] for c in first} == {f"gate/{n}.txt" for n in range(25)}
    assert first[0]["new"]["rule"] == "rules[1]"
    assert all(c["change"] == "deny→approve" for c in report["changes"][25:])
    # people: 50 → 5 protected + 20 deny/ now approve + 20 posts
    assert report["approval_rate"]["after_count"] == 45


def test_a_tighter_policy_exits_0_and_counts_what_now_waits(
    site: dict[str, Any], home: Path
) -> None:
    code, report = replay(site, home, "tighter.toml")
    assert code == 0
    assert report["changed"] == 50 and report["tightened"] == 50 and report["loosened"] == 0
    assert report["by_effect"]["http.request"] == {"auto→approve": 50, "unchanged": 20}
    assert report["approval_rate"]["after"] == 0.5


def test_since_and_sandbox_narrow_the_replay(site: dict[str, Any], home: Path) -> None:
    code, report = replay(site, home, "tighter.toml", "--since", "30d")
    assert code == 0 and report["replayed"] == 150 and report["changed"] == 0
    code, report = replay(site, home, "looser.toml", "--sandbox", "other")
    assert code == 0 and report["replayed"] == 70 and report["changed"] == 0
    assert report["skipped"] == {}
    code, report = replay(site, home, "looser.toml", "--sandbox", "default", "--since", "30d")
    assert code == 3 and report["replayed"] == 130 and report["unattended"] == 25


def test_the_text_report_names_the_risky_requests_first(site: dict[str, Any], home: Path) -> None:
    done = run_broker(
        "policy",
        "replay",
        str(site["base"] / "looser.toml"),
        "--config",
        str(site["config"]),
        home=home,
    )
    assert done.returncode == 3
    lines = done.stdout.splitlines()
    assert lines[0] == " WOULD AUTO-APPLY 5 REQUESTS PEOPLE DENIED "  # first and loudest
    assert all("was: denied by bob" in text for text in lines[1:6])
    assert lines[6].startswith("replayed 200 request(s) through")
    assert "skipped (never reached the policy): 5 invalid" in done.stdout
    risky = lines.index("WOULD APPLY WITHOUT A PERSON: 25 request(s)")
    loose = next(i for i, text in enumerate(lines) if text.startswith("LOOSENED"))
    assert risky < loose
    assert "approve→auto  by rules[1]" in lines[risky + 1]
    assert "approval rate (needs a person): 25.0% (50) → 22.5% (45)" in done.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["missing.toml"], "missing.toml"),
        (["bad.toml"], "rules[0]"),
        (["same.toml", "--since", "soon"], "--since"),
    ],
)
def test_bad_input_is_one_line(
    site: dict[str, Any], home: Path, args: list[str], words: str
) -> None:
    (site["base"] / "bad.toml").write_text('[[rules]]\neffect = "files.write"\naction = "maybe"\n')
    paths = [str(site["base"] / a) if a.endswith(".toml") else a for a in args]
    done = run_broker("policy", "replay", *paths, "--config", str(site["config"]), home=home)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr
