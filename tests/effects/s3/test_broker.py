"""Through a real broker: entry points, auto-apply, approval, invalid requests."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.approval.decisions import Ballot, decide, nudge
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness
from effects import s3
from tests.effects.conftest import S3_OUTSIDE, S3_PLAIN, S3_VERSIONED
from tests.effects.s3.support import exists, put, read

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


# -- through the broker --------------------------------------------------------------


def _decide(h: BrokerHarness, rid: str) -> None:
    ledger = Ledger(h.config.ledger_path)
    try:
        decide(
            ledger,
            Ballot(rid, "approve", approver="alice", reason=None, surface="web", sha256=None),
        )
    finally:
        ledger.close()
        nudge(h.state)


def harness(tmp_path: Path, settings: dict[str, Any]) -> BrokerHarness:
    """A broker serving the three S3 effects only (other plugins may be mid-change)."""
    return BrokerHarness(
        tmp_path / "h",
        handlers=[s3.PutObject(), s3.CopyObject(), s3.DeleteObject()],
        integrations={"s3": settings},
        builtins=False,
    )


def test_effects_are_installed_as_entry_points() -> None:
    """`pip install` registers the three effects under broker.effects."""
    found = {
        ep.load().name for ep in entry_points(group="broker.effects") if ep.name.startswith("s3.")
    }
    assert found == {"s3.put_object", "s3.copy_object", "s3.delete_object"}


class TestThroughTheBroker:
    def test_put_to_a_versioned_bucket_is_applied_automatically(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """No policy: a reversible put (versioned bucket, attachment body) applies at once."""
        with harness(tmp_path, s3_settings) as h:
            h.write("req.blob.bin", b"bytes from the sandbox")
            doc = h.request(
                "s3.put_object",
                {"bucket": S3_VERSIONED, "key": "out/r.bin", "body_attachment": "blob"},
                attachments=["blob"],
            )
            result = h.submit(doc, name="req")
        assert result["status"] == "applied", result
        assert result["output"]["version_id"]
        assert read(s3_client, S3_VERSIONED, "out/r.bin") == b"bytes from the sandbox"
        assert "testing-secret-key" not in (h.results / f"{doc['id']}.json").read_text()
        # nothing piles up: what was observed is kept with the request until it ends
        ledger = Ledger(h.config.ledger_path)
        try:
            record = ledger.find(doc["id"])
        finally:
            ledger.close()
        assert record is not None and record.seen is None
        assert not (h.state / "s3").exists()

    def test_unversioned_overwrite_waits_and_fails_if_the_object_changes(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """An irreversible overwrite is pending; approved after a change, it fails (412)."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"old")
        with harness(tmp_path, s3_settings) as h:
            doc = h.request("s3.put_object", put(S3_PLAIN, "a.txt", "agent"))
            pending = h.submit(doc, terminal=False)
            assert pending["status"] == "pending", pending
            assert read(s3_client, S3_PLAIN, "a.txt") == b"old"
            s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"someone else")
            _decide(h, doc["id"])
            result = h.wait(doc["id"])
        assert result["status"] == "failed"
        assert "changed since it was shown to the approver" in result["reason"]
        assert read(s3_client, S3_PLAIN, "a.txt") == b"someone else"

    def test_approved_unversioned_overwrite_is_applied(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Approved while the object is as shown, the overwrite goes through."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"old")
        with harness(tmp_path, s3_settings) as h:
            doc = h.request("s3.put_object", put(S3_PLAIN, "a.txt", "agent"))
            assert h.submit(doc, terminal=False)["status"] == "pending"
            _decide(h, doc["id"])
            result = h.wait(doc["id"])
        assert result["status"] == "applied", result
        assert read(s3_client, S3_PLAIN, "a.txt") == b"agent"

    def test_other_bucket_is_invalid_with_its_path(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """A put outside the allowlist is `invalid` at /params/bucket, naming what is allowed."""
        with harness(tmp_path, s3_settings) as h:
            result = h.submit(h.request("s3.put_object", put(S3_OUTSIDE, "a.txt", "x")))
        assert result["status"] == "invalid"
        assert result["errors"][0]["path"] == "/params/bucket"
        assert "versioned-scratch/*" in result["reason"]
        assert not exists(s3_client, S3_OUTSIDE, "a.txt")
