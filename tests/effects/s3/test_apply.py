"""Applying: puts, copies and deletes, each a conditional write."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from broker.errors import EffectFailed
from tests.effects.conftest import S3_PLAIN, S3_VERSIONED
from tests.effects.s3.support import COPY, DELETE, PUT, ctx_for, exists, facts, put, read

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


# -- applying ------------------------------------------------------------------------


class TestPut:
    def test_put_in_a_versioned_bucket_returns_what_undo_needs(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """The output names bucket, key, the new version and the version it replaced."""
        old = s3_client.put_object(Bucket=S3_VERSIONED, Key="a.txt", Body=b"old")
        ctx = ctx_for(tmp_path, s3_settings)
        params = put(S3_VERSIONED, "a.txt", "new", metadata={"run": "42"})
        assert PUT.reversible_for(params, ctx) is True
        out = PUT.apply(params, ctx)
        assert read(s3_client, S3_VERSIONED, "a.txt") == b"new"
        assert out["version_id"] and out["version_id"] != old["VersionId"]
        assert out["previous"] == {
            "exists": True,
            "etag": old["ETag"],
            "version_id": old["VersionId"],
            "bytes": 3,
        }
        assert out["revertible"] is True
        head = s3_client.head_object(Bucket=S3_VERSIONED, Key="a.txt")
        assert head["Metadata"] == {"run": "42"}
        assert head["ContentType"] == "text/plain; charset=utf-8"

    def test_new_key_in_an_unversioned_bucket_did_not_exist(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """A new key in an unversioned bucket reports no version and 'did not exist'."""
        out = PUT.apply(put(S3_PLAIN, "n.txt", "x"), ctx_for(tmp_path, s3_settings))
        assert out["previous"] == {"exists": False}
        assert (out["version_id"], out["versioned"], out["revertible"]) == (None, False, True)

    def test_attachment_is_the_body(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """The host-side copy of an attachment is uploaded byte for byte."""
        blob = os.urandom(300_000)
        stored = tmp_path / "blob.bin"
        stored.write_bytes(blob)
        ctx = ctx_for(tmp_path, s3_settings, attachments={"build": stored})
        params = {
            "bucket": S3_VERSIONED,
            "key": "builds/app.tar",
            "body_attachment": "build",
            "content_type": "application/x-tar",
        }
        PUT.check(params, ctx)
        preview = PUT.preview(params, ctx)
        assert facts(preview)["new sha256"] == hashlib.sha256(blob).hexdigest()
        out = PUT.apply(params, ctx)
        assert read(s3_client, S3_VERSIONED, "builds/app.tar") == blob
        assert out["sha256"] == hashlib.sha256(blob).hexdigest() and out["bytes"] == len(blob)
        head = s3_client.head_object(Bucket=S3_VERSIONED, Key="builds/app.tar")
        assert head["ContentType"] == "application/x-tar"


class TestConditionalWrites:
    def test_change_after_the_preview_fails_with_412(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """A write that the approver saw against another ETag fails; the object is kept."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"seen")
        ctx = ctx_for(tmp_path, s3_settings)
        params = put(S3_PLAIN, "a.txt", "agent")
        PUT.reversible_for(params, ctx)
        PUT.preview(params, ctx)
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"someone else")
        with pytest.raises(EffectFailed) as caught:
            PUT.apply(params, ctx)
        assert "changed since it was shown to the approver" in caught.value.reason
        assert isinstance(caught.value.__cause__, ClientError)
        assert caught.value.__cause__.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        assert read(s3_client, S3_PLAIN, "a.txt") == b"someone else"

    def test_key_created_after_an_auto_classification_is_not_overwritten(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Classified as a new key (reversible, auto), a key that appears meanwhile is kept."""
        ctx = ctx_for(tmp_path, s3_settings)
        params = put(S3_PLAIN, "a.txt", "agent")
        assert PUT.reversible_for(params, ctx) is True
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"someone else")
        with pytest.raises(EffectFailed, match="changed since the broker classified"):
            PUT.apply(params, ctx)
        assert read(s3_client, S3_PLAIN, "a.txt") == b"someone else"

    def test_stale_if_match_from_the_agent_fails(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """An agent's if_match that no longer holds fails with a reason naming it."""
        first = s3_client.put_object(Bucket=S3_VERSIONED, Key="a.txt", Body=b"one")
        s3_client.put_object(Bucket=S3_VERSIONED, Key="a.txt", Body=b"two")
        params = put(S3_VERSIONED, "a.txt", "three", if_match=first["ETag"])
        with pytest.raises(EffectFailed, match="does not meet the request's if_match"):
            PUT.apply(params, ctx_for(tmp_path, s3_settings))
        assert read(s3_client, S3_VERSIONED, "a.txt") == b"two"

    def test_if_none_match_refuses_an_existing_key(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """if_none_match: * fails on a key that exists, and leaves it alone."""
        s3_client.put_object(Bucket=S3_VERSIONED, Key="a.txt", Body=b"there")
        params = put(S3_VERSIONED, "a.txt", "new", if_none_match="*")
        with pytest.raises(EffectFailed, match="if_none_match"):
            PUT.apply(params, ctx_for(tmp_path, s3_settings))
        assert read(s3_client, S3_VERSIONED, "a.txt") == b"there"

    def test_matching_if_match_writes(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """An if_match that still holds lets the write through."""
        now = s3_client.put_object(Bucket=S3_VERSIONED, Key="a.txt", Body=b"one")
        params = put(S3_VERSIONED, "a.txt", "two", if_match=now["ETag"].strip('"'))
        PUT.apply(params, ctx_for(tmp_path, s3_settings))
        assert read(s3_client, S3_VERSIONED, "a.txt") == b"two"

    def test_copy_onto_a_key_created_after_the_preview_fails(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """A copy onto a key the approver saw absent fails once the key exists."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="src.txt", Body=b"source")
        ctx = ctx_for(tmp_path, s3_settings)
        params = {"bucket": S3_PLAIN, "key": "dst.txt", "source_bucket": S3_PLAIN}
        params["source_key"] = "src.txt"
        COPY.preview(params, ctx)
        s3_client.put_object(Bucket=S3_PLAIN, Key="dst.txt", Body=b"someone else")
        with pytest.raises(EffectFailed, match="changed since it was shown to the approver"):
            COPY.apply(params, ctx)
        assert read(s3_client, S3_PLAIN, "dst.txt") == b"someone else"

    def test_copy_of_a_source_changed_after_the_preview_fails(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """The approver saw the source's content: a changed source is not copied."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="src.txt", Body=b"reviewed")
        ctx = ctx_for(tmp_path, s3_settings)
        params = {"bucket": S3_VERSIONED, "key": "dst.txt", "source_bucket": S3_PLAIN}
        params["source_key"] = "src.txt"
        COPY.preview(params, ctx)
        s3_client.put_object(Bucket=S3_PLAIN, Key="src.txt", Body=b"swapped")
        with pytest.raises(EffectFailed, match=r"source s3://plain-scratch/src\.txt changed"):
            COPY.apply(params, ctx)
        assert not exists(s3_client, S3_VERSIONED, "dst.txt")

    def test_stale_if_match_on_delete_fails(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """A delete conditioned on an old ETag fails (412) and the object stays."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"now")
        params = {"bucket": S3_PLAIN, "key": "a.txt", "if_match": '"not-it"'}
        with pytest.raises(EffectFailed, match="if_match"):
            DELETE.apply(params, ctx_for(tmp_path, s3_settings))
        assert exists(s3_client, S3_PLAIN, "a.txt")
