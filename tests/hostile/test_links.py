"""Links planted by an agent in a real container: refused, and never followed, even
while the agent swaps a link in and out under the broker's feet."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.hostile.conftest import FIGURES, HostileHost, OpenProbe

PLANT = r"""
import json, os, sys
secret = sys.argv[1]
os.symlink(secret, "/outbox/sym.json")
os.symlink("/outbox", "/outbox/dirlink.json")
with open("/outbox/.hard.tmp", "w") as f:
    f.write(json.dumps({"version": 1, "id": "hard", "effect": "test.record",
                        "params": {"value": "hard"}}))
os.link("/outbox/.hard.tmp", "/outbox/hard.json")
print(json.dumps({"planted": sorted(os.listdir("/outbox"))}))
"""

SWAP = r"""
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
secret, count, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
swaps, end = 0, time.monotonic() + seconds
for i in range(count):
    name = f"/outbox/swap-{i}.json".encode()
    real, link = f"/outbox/.real-{i}".encode(), f"/outbox/.link-{i}".encode()
    with open(real, "w") as f:
        f.write(json.dumps({"version": 1, "id": f"swap-{i}", "effect": "test.record",
                            "params": {"value": f"real-{i}"}}))
    os.symlink(secret, link)
    os.rename(real, name)
    # swap the request and the link back and forth until the broker takes the name
    while time.monotonic() < end:
        if libc.renameat2(AT_FDCWD, link, AT_FDCWD, name, RENAME_EXCHANGE) != 0:
            break
        swaps += 1
    if time.monotonic() >= end:
        count = i + 1
        break
print(json.dumps({"requests": count, "swaps": swaps}))
"""


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A host file holding a valid request the agent would love the broker to read."""
    folder = tmp_path / "host-secrets"
    folder.mkdir()
    path = folder / "stolen.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "id": "stolen",
                "effect": "test.record",
                "params": {"value": f"HOST-SECRET-{uuid.uuid4().hex}"},
            }
        )
    )
    return path


def leaked(host: HostileHost, secret: Path) -> list[str]:
    """Where the secret's content shows up in what the broker wrote."""
    marker = json.loads(secret.read_text())["params"]["value"].encode()
    places = [host.state / "audit.jsonl", host.state / "ledger.sqlite3"]
    places += list((host.state / "sandboxes").glob("*/results/*"))
    found = [str(p) for p in places if p.is_file() and marker in p.read_bytes()]
    found += [f"applied {a}" for a in host.record.applied if a.get("value") == marker.decode()]
    return found


@pytest.mark.docker
def test_symlink_and_hard_link_from_the_sandbox_are_refused(
    host: HostileHost, secret: Path
) -> None:
    """Symlinks to a host file or a dir and a hard link, made in the sandbox, are refused unread."""
    paths = host.sandbox()
    host.start()
    probe = OpenProbe(secret.parent)
    probe.prove(secret)
    ran = host.run(paths, PLANT, str(secret))
    assert ran.code == 0, ran.stderr

    results = host.wait_results(paths, ["sym", "dirlink", "hard"])
    probe.close()

    assert {k: (r["status"], r["errors"][0]["code"]) for k, r in results.items()} == {
        "sym": ("invalid", "not_regular_file"),
        "dirlink": ("invalid", "not_regular_file"),
        "hard": ("invalid", "hard_link"),
    }
    assert probe.events == [], f"the broker opened the link target: {probe.events}"
    assert leaked(host, secret) == []
    assert host.record.applied == []
    host.still_serving(paths)


@pytest.mark.docker
def test_symlink_swapped_in_while_the_broker_reads_is_never_followed(
    host: HostileHost, secret: Path
) -> None:
    """Swapping a request with a symlink in a tight loop never makes the broker read the target."""
    paths = host.sandbox()
    host.start()
    probe = OpenProbe(secret.parent)
    probe.prove(secret)
    ran = host.run(paths, SWAP, str(secret), "300", "3")
    assert ran.code == 0, ran.stderr
    race = ran.json()
    ids = [f"swap-{i}" for i in range(race["requests"])]

    results = host.wait_results(paths, ids, timeout=30)
    probe.close()

    outcomes = {(r["status"], tuple(e["code"] for e in r["errors"])) for r in results.values()}
    assert outcomes <= {("applied", ()), ("invalid", ("not_regular_file",))}, outcomes
    applied = {a["value"] for a in host.record.applied}
    assert applied <= {f"real-{i}" for i in range(race["requests"])}
    assert probe.events == [], f"the broker opened the link target: {probe.events}"
    assert leaked(host, secret) == []
    refused = sum(r["status"] == "invalid" for r in results.values())
    FIGURES["swap"] = (
        f"swap race: {race['requests']} requests, {race['swaps']} exchanges, "
        f"{len(applied)} applied as written, {refused} refused as links, 0 target reads"
    )
