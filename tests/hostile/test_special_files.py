"""Files that are not plain finished files, made by an agent in a real container (or,
for device nodes, which the sandbox cannot make, by root on the host): each is
answered quickly and safely, and the broker keeps serving.

The host-side versions of the FIFO, socket, sparse-file and malformed-JSON cases
live in tests/test_intake.py; these check what a sandboxed agent can really do.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from broker.testing import BrokerHarness
from tests.crash.support import wait_for
from tests.hostile.conftest import HostileHost

SPECIAL = r"""
import json, os, socket, stat, time
started = time.monotonic()
os.mkfifo("/outbox/.fifo.tmp")
os.rename("/outbox/.fifo.tmp", "/outbox/fifo.json")
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind("/outbox/sock.json")
with open("/outbox/.sparse.tmp", "wb") as f:
    f.truncate(100 * 2**30)
os.rename("/outbox/.sparse.tmp", "/outbox/sparse.json")
made = {}
for kind, mode in (("char", stat.S_IFCHR), ("block", stat.S_IFBLK)):
    try:
        os.mknod(f"/outbox/.{kind}.tmp", mode | 0o600, os.makedev(1, 3))
        made[kind] = "made"
    except PermissionError:
        made[kind] = "EPERM"
time.sleep(1.5)  # keep the socket bound while the broker looks at it
print(json.dumps({"mknod": made}))
"""

HELD_OPEN = r"""
import json, os, sys, time
hold = float(sys.argv[1])
doc = json.dumps({"version": 1, "id": "held", "effect": "test.record",
                  "params": {"value": "complete " + "x" * 200}}).encode()
fd = os.open("/outbox/held.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, doc[: len(doc) // 2])
print("half written", flush=True)
time.sleep(hold)
os.write(fd, doc[len(doc) // 2 :])
os.close(fd)
print(json.dumps({"closed_at": time.time()}))
"""


@pytest.mark.docker
def test_fifo_socket_and_sparse_file_from_the_sandbox_are_answered(host: HostileHost) -> None:
    """A FIFO, a socket and a 100 GiB sparse file are refused in seconds; mknod is denied."""
    paths = host.sandbox()
    host.start()
    started = time.monotonic()
    agent = host.start_agent(paths, SPECIAL)

    results = host.wait_results(paths, ["fifo", "sock", "sparse"], timeout=5)
    took = time.monotonic() - started
    assert agent.wait(timeout=30)["StatusCode"] == 0
    made = json.loads(agent.logs(stdout=True, stderr=False).decode().splitlines()[-1])

    assert {k: (r["status"], r["errors"][0]["code"]) for k, r in results.items()} == {
        "fifo": ("invalid", "not_regular_file"),
        "sock": ("invalid", "not_regular_file"),
        "sparse": ("invalid", "too_large"),
    }
    assert took < 5
    assert made == {"mknod": {"char": "EPERM", "block": "EPERM"}}
    assert not [n for n in os.listdir(paths.outbox) if n.endswith(".json")]
    host.still_serving(paths)


def test_device_node_in_attach_mode_is_refused_not_read(attach_harness: BrokerHarness) -> None:
    """A device node with /dev/null's numbers (attach mode, made by root) is refused, not read."""
    tmp = attach_harness.outbox / ".devnull.tmp"
    try:
        os.mknod(tmp, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root (CAP_MKNOD)")
    os.rename(tmp, attach_harness.outbox / "devnull.json")

    result = attach_harness.wait("devnull", timeout=5)

    assert result["status"] == "invalid"
    assert [e["code"] for e in result["errors"]] == ["not_regular_file"]
    assert "device" in result["reason"]
    assert not os.path.lexists(attach_harness.outbox / "devnull.json")


@pytest.mark.docker
def test_request_still_being_written_is_not_read_half_way(
    host: HostileHost, tmp_path: Path
) -> None:
    """A request held open half-written is not answered from its partial bytes; it applies whole."""
    host.rescan_s = 0.3
    paths = host.sandbox()
    host.start()
    agent = host.start_agent(paths, HELD_OPEN, "2")
    wait_for(lambda: b"half written" in agent.logs(), 10, "the agent to half-write its request")
    time.sleep(1.2)
    early = host.results(paths).get("held")
    assert agent.wait(timeout=30)["StatusCode"] == 0

    result = host.wait_results(paths, ["held"])["held"]

    assert early is None, f"answered while still being written: {early}"
    assert result["status"] == "applied", result
    assert [a["value"] for a in host.record.applied] == ["complete " + "x" * 200]
