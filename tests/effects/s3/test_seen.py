"""What the broker saw of an object: the preview (or the classification) remembers it
(`ctx.remember`), the broker keeps it with the request, and apply sends it to S3 as the
write's condition. Without it, apply uses the weaker condition the handler documents:
the agent's if_match / if_none_match, else the object as read just before the write."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from broker.approval.decisions import Ballot, decide, nudge
from broker.context import Memo
from broker.errors import EffectFailed
from broker.store.sqlite import Ledger
from broker.testing import BrokerHarness, make_context
from effects import s3
from effects.base import Context
from tests.effects.conftest import S3_PLAIN, S3_VERSIONED
from tests.effects.s3.support import DELETE, PUT, put, read

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def ctx_with(tmp_path: Path, settings: dict[str, Any], memo: Memo) -> Context:
    """A fresh Context for one call, sharing `memo` as the broker shares a request's."""
    return make_context(settings, integration="s3", state_dir=tmp_path / "state", memo=memo)


class TestWhatIsRemembered:
    def test_the_preview_remembers_the_object_it_showed(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """The approver's stage and the object's ETag are kept; nothing goes to disk."""
        now = s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"old")
        memo = Memo()
        PUT.preview(put(S3_PLAIN, "a.txt", "new"), ctx_with(tmp_path, s3_settings, memo))
        seen = memo.recall()
        assert seen is not None and seen["stage"] == "approver"
        assert seen["target"]["etag"] == now["ETag"] and seen["target"]["versioning"] == "off"
        assert not (tmp_path / "state" / "s3").exists()

    def test_what_a_person_saw_outranks_a_later_classification(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Classified again after the preview, the request still holds what was shown."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"shown")
        memo = Memo()
        params = put(S3_PLAIN, "a.txt", "agent")
        PUT.preview(params, ctx_with(tmp_path, s3_settings, memo))
        shown = memo.recall()
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"someone else")
        PUT.reversible_for(params, ctx_with(tmp_path, s3_settings, memo))
        assert memo.recall() == shown
        with pytest.raises(EffectFailed, match="changed since it was shown to the approver"):
            PUT.apply(params, ctx_with(tmp_path, s3_settings, memo))
        assert read(s3_client, S3_PLAIN, "a.txt") == b"someone else"


class TestApplyWithAndWithoutIt:
    def test_shared_memo_holds_the_overwrite_to_what_was_shown(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Preview and apply in separate contexts sharing one memo: S3 refuses (412)."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"shown")
        memo = Memo()
        params = put(S3_PLAIN, "a.txt", "agent")
        PUT.preview(params, ctx_with(tmp_path, s3_settings, memo))
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"someone else")
        with pytest.raises(EffectFailed, match="changed since it was shown to the approver"):
            PUT.apply(params, ctx_with(tmp_path, s3_settings, memo))
        assert read(s3_client, S3_PLAIN, "a.txt") == b"someone else"

    def test_without_it_the_write_holds_to_the_object_read_just_before(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Nothing remembered: the overwrite goes through, and `previous` is exact."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"shown")
        params = put(S3_PLAIN, "a.txt", "agent")
        PUT.preview(params, ctx_with(tmp_path, s3_settings, Memo()))
        now = s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"someone else!")
        out = PUT.apply(params, ctx_with(tmp_path, s3_settings, Memo()))
        assert read(s3_client, S3_PLAIN, "a.txt") == b"agent"
        assert out["previous"] == {
            "exists": True,
            "etag": now["ETag"],
            "version_id": None,
            "bytes": len(b"someone else!"),
        }
        assert out["revertible"] is False

    def test_without_it_the_agents_condition_is_the_one_sent(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Nothing remembered, if_none_match from the agent: an existing key is kept."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"there")
        params = put(S3_PLAIN, "a.txt", "agent", if_none_match="*")
        with pytest.raises(EffectFailed, match="does not meet the request's if_none_match"):
            PUT.apply(params, ctx_with(tmp_path, s3_settings, Memo()))
        assert read(s3_client, S3_PLAIN, "a.txt") == b"there"

    def test_versioning_turned_off_since_classification_fails(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Classified reversible in a versioned bucket, the delete refuses to run once the
        bucket keeps no versions; with nothing remembered it deletes."""
        s3_client.put_object(Bucket=S3_VERSIONED, Key="a.txt", Body=b"keep")
        memo = Memo()
        params = {"bucket": S3_VERSIONED, "key": "a.txt"}
        assert DELETE.reversible_for(params, ctx_with(tmp_path, s3_settings, memo)) is True
        s3_client.put_bucket_versioning(
            Bucket=S3_VERSIONED, VersioningConfiguration={"Status": "Suspended"}
        )
        with pytest.raises(EffectFailed, match=r"versioning of the bucket .* was turned off"):
            DELETE.apply(params, ctx_with(tmp_path, s3_settings, memo))
        out = DELETE.apply(params, ctx_with(tmp_path, s3_settings, Memo()))
        assert out["deleted"] is True


def test_the_broker_keeps_what_the_approver_saw_until_the_request_ends(
    tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
) -> None:
    """A pending overwrite holds the preview's observation in the ledger; once applied,
    nothing is kept, and nothing was ever written under the state dir for it."""
    shown = s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"old")
    h = BrokerHarness(
        tmp_path / "h",
        handlers=[s3.PutObject(), s3.CopyObject(), s3.DeleteObject()],
        integrations={"s3": s3_settings},
        builtins=False,
    )
    with h:
        doc = h.request("s3.put_object", put(S3_PLAIN, "a.txt", "agent"))
        assert h.submit(doc, terminal=False)["status"] == "pending"
        ledger = Ledger(h.config.ledger_path)
        try:
            pending = ledger.find(doc["id"])
            decide(
                ledger,
                Ballot(doc["id"], "approve", approver="a", reason=None, surface="web", sha256=None),
            )
        finally:
            ledger.close()
            nudge(h.state)
        result = h.wait(doc["id"])
        ledger = Ledger(h.config.ledger_path)
        try:
            ended = ledger.find(doc["id"])
        finally:
            ledger.close()
    assert pending is not None and pending.seen is not None
    assert pending.seen["stage"] == "approver"
    assert pending.seen["target"]["etag"] == shown["ETag"]
    assert result["status"] == "applied", result
    assert read(s3_client, S3_PLAIN, "a.txt") == b"agent"
    assert ended is not None and ended.seen is None
    assert not (h.state / "s3").exists()
