"""A state dir that runs out of space: the broker stops loudly instead of answering
what it could not record, and picks everything up once there is room again."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.models import TERMINAL
from tests.crash.support import (
    FIGURES,
    Receiver,
    Site,
    audit_disagreements,
    schema_problems,
    wait_for,
)
from tests.support import PATIENCE

SIZE = "2m"


def fill(folder: Path) -> Path:
    """Write a file in `folder` until the file system says it is full."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 16, 1 << 12, 1 << 9):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)
    return filler


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, mounted for this test (root only; CI runs as root)."""
    where = tmp_path / "small-disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        reason = f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}"
        if os.environ.get("CI"):
            pytest.fail(f"CI runs as root and must run the disk-full test; {reason}")
        pytest.skip(reason)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def request(rid: str) -> dict[str, object]:
    return {"version": 1, "id": rid, "effect": "crashtest.post", "params": {"value": rid}}


def test_full_state_disk_stops_the_broker_loudly_and_it_recovers(
    tmp_path: Path, small_disk: Path, receiver: Receiver
) -> None:
    """A full state disk stops `broker serve` with one error line; with room, all are answered."""
    site = Site(tmp_path / "site", receiver.url)
    state = small_disk / "state"
    site.config.write_text(site.config.read_text().replace(str(site.state), str(state)))
    site.state = state
    site.claim = site.root / "claimed"  # claims stay on the outbox's file system

    broker = site.start()
    try:
        for i in range(3):
            site.write(f"before-{i}.json", request(f"before-{i}"))
        wait_for(lambda: len(site.results_now()) == 3, PATIENCE, "the first requests answered")
        filler = fill(small_disk)
        late = [f"full-{i}" for i in range(20)]
        for rid in late:
            site.write(f"{rid}.json", request(rid))
        code = broker.wait(20)
    finally:
        broker.kill()
    log = broker.output()
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    answered_while_full = {rid: r["status"] for rid, r in site.results_now().items() if rid in late}
    recorded = {r.id: r.state for r in site.ledger()}

    filler.unlink()
    again = site.start(log_name="after-space-returned.log")
    try:
        wait_for(
            lambda: all(site.results_now().get(r, {}).get("status") in TERMINAL for r in late),
            30,
            "every request answered once there is room",
        )
    finally:
        assert again.stop() == 0, again.output()
    results = site.results_now()
    FIGURES.disk_full = (
        f"broker exit {code}, {len(errors)} error line(s), "
        f"{len(answered_while_full)} answered while full, "
        f"{sum(results[r]['status'] == 'applied' for r in late)}/{len(late)} applied after"
    )

    assert code not in (None, 0), f"the broker kept running on a full disk:\n{log[-3000:]}"
    assert "Traceback" not in log, log[-3000:]
    assert len(errors) == 1, f"expected one clear error line, got:\n{log[-3000:]}"
    assert any(w in errors[0] for w in ("full", "space")), errors[0]
    for rid, status in answered_while_full.items():
        assert recorded.get(rid) == status, f"{rid}: answered {status}, ledger has {recorded}"
    assert all(results[r]["status"] == "applied" for r in late), results
    assert all(not schema_problems(r) for r in results.values())
    assert audit_disagreements(site.state) == []
