"""Attachments: bytes beside a request, stored by digest and covered by its sha256."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from broker.config import Limits
from broker.events import Rescan
from broker.testing import BrokerHarness, FakeHandler
from effects.base import Context


class BlobHandler(FakeHandler):
    """Reads the attachment named in params and reports its size and digest."""

    def apply(self, params: Any, ctx: Context) -> dict[str, Any]:
        data = ctx.attachment(params["value"]).read_bytes()
        return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _harness(tmp_path: Path, **kw: Any) -> BrokerHarness:
    return BrokerHarness(tmp_path / "h", handlers=[BlobHandler("test.blob")], **kw)


def test_attachment_reaches_the_handler_and_leaves_the_outbox(tmp_path: Path) -> None:
    """A listed attachment is read, stored by digest, handed to the handler, removed."""
    blob = os.urandom(200_000)
    with _harness(tmp_path) as h:
        h.write("req.fix.bin", blob)
        result = h.submit(
            {
                "version": 1,
                "effect": "test.blob",
                "params": {"value": "fix"},
                "attachments": ["fix"],
            },
            name="req",
        )
        assert result["status"] == "applied"
        assert result["output"] == {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        assert list(h.outbox.iterdir()) == []
        stored = h.state / "attachments" / hashlib.sha256(blob).hexdigest()
        assert stored.read_bytes() == blob


def test_request_sha256_covers_the_attachment(tmp_path: Path) -> None:
    """Two requests identical but for their attachment bytes have different sha256."""
    with _harness(tmp_path) as h:
        shas = []
        for name, data in (("a", b"one"), ("b", b"two")):
            h.write(f"{name}.x.bin", data)
            doc = {
                "version": 1,
                "effect": "test.blob",
                "params": {"value": "x"},
                "attachments": ["x"],
            }
            shas.append(h.submit(doc, name=name)["request_sha256"])
        assert shas[0] != shas[1]


def test_missing_attachment_is_invalid_with_its_path(tmp_path: Path) -> None:
    """A request listing an attachment that was never written is invalid and says which."""
    with _harness(tmp_path) as h:
        result = h.submit(
            {
                "version": 1,
                "effect": "test.blob",
                "params": {"value": "gone"},
                "attachments": ["gone"],
            },
            name="req",
        )
        assert result["status"] == "invalid"
        assert result["errors"][0]["path"] == "/attachments/0"
        assert result["errors"][0]["code"] == "missing_attachment"
        assert "req.gone.bin" in result["reason"]


def test_oversize_attachment_is_invalid(tmp_path: Path) -> None:
    """An attachment over the cap is refused without being stored."""
    with _harness(tmp_path, limits=Limits(max_attachment_bytes=1000)) as h:
        h.write("req.big.bin", b"x" * 1001)
        result = h.submit(
            {
                "version": 1,
                "effect": "test.blob",
                "params": {"value": "big"},
                "attachments": ["big"],
            },
            name="req",
        )
        assert result["status"] == "invalid"
        assert result["errors"][0]["code"] == "too_large"
        assert not (h.state / "attachments").exists() or not any(
            (h.state / "attachments").iterdir()
        )


def test_symlink_attachment_is_refused(tmp_path: Path) -> None:
    """An attachment that is a symbolic link to a host file is never followed."""
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    with _harness(tmp_path) as h:
        os.symlink(secret, h.outbox / "req.s.bin")
        result = h.submit(
            {"version": 1, "effect": "test.blob", "params": {"value": "s"}, "attachments": ["s"]},
            name="req",
        )
        assert result["status"] == "invalid"
        assert result["errors"][0]["code"] == "not_regular_file"
        assert secret.read_text() == "host secret"


def test_orphan_attachment_is_cleaned_up_after_grace(tmp_path: Path) -> None:
    """An attachment whose request never comes is removed on a rescan after the grace."""
    with _harness(tmp_path, limits=Limits(attachment_grace_s=0.1)) as h:
        h.write("lost.blob.bin", b"data")
        old = os.stat(h.outbox / "lost.blob.bin").st_mtime - 60
        os.utime(h.outbox / "lost.blob.bin", (old, old))
        assert h.broker is not None
        h.broker.events.put(Rescan())
        for _ in range(200):
            if not (h.outbox / "lost.blob.bin").exists():
                break
            import time

            time.sleep(0.01)
        assert not (h.outbox / "lost.blob.bin").exists()
