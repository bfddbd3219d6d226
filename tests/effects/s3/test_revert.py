"""Undo: one delete of the version written, the new key, or the delete marker."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from broker.errors import EffectFailed
from tests.effects.conftest import S3_PLAIN, S3_VERSIONED
from tests.effects.s3.support import COPY, DELETE, PUT, ctx_for, exists, facts, put, read

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


# -- undo ----------------------------------------------------------------------------


class TestRevert:
    def test_revert_of_an_overwrite_restores_the_previous_version(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Undo removes the version written; the old version is current again."""
        old = s3_client.put_object(Bucket=S3_VERSIONED, Key="a.txt", Body=b"old\n")
        ctx = ctx_for(tmp_path, s3_settings)
        out = PUT.apply(put(S3_VERSIONED, "a.txt", "new\n"), ctx)
        preview = PUT.revert_preview(out, ctx)
        assert f"version {old['VersionId']} is current again" in preview.title
        assert "-new\n" in preview.body and "+old\n" in preview.body
        undone = PUT.revert(out, ctx)
        assert read(s3_client, S3_VERSIONED, "a.txt") == b"old\n"
        head = s3_client.head_object(Bucket=S3_VERSIONED, Key="a.txt")
        assert head["VersionId"] == old["VersionId"]
        assert undone["now"]["version_id"] == old["VersionId"]

    def test_revert_restores_an_object_written_before_versioning(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """An object from before versioning was enabled (version "null") comes back."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"ancient\n")
        s3_client.put_bucket_versioning(
            Bucket=S3_PLAIN, VersioningConfiguration={"Status": "Enabled"}
        )
        ctx = ctx_for(tmp_path, s3_settings)
        out = PUT.apply(put(S3_PLAIN, "a.txt", "new\n"), ctx)
        assert out["revertible"] is True
        assert "+ancient\n" in PUT.revert_preview(out, ctx).body
        PUT.revert(out, ctx)
        assert read(s3_client, S3_PLAIN, "a.txt") == b"ancient\n"

    def test_revert_of_a_new_versioned_key_removes_it(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Undoing the first write of a key leaves no trace of it."""
        ctx = ctx_for(tmp_path, s3_settings)
        out = PUT.apply(put(S3_VERSIONED, "fresh.txt", "x"), ctx)
        PUT.revert(out, ctx)
        assert not exists(s3_client, S3_VERSIONED, "fresh.txt")
        listed = s3_client.list_object_versions(Bucket=S3_VERSIONED, Prefix="fresh.txt")
        assert "Versions" not in listed and "DeleteMarkers" not in listed

    def test_revert_of_a_new_unversioned_key_deletes_it(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """A new key in an unversioned bucket is undone by deleting it."""
        ctx = ctx_for(tmp_path, s3_settings)
        out = PUT.apply(put(S3_PLAIN, "n.txt", "x"), ctx)
        assert PUT.revert_preview(out, ctx).title.startswith("delete s3://plain-scratch/n.txt")
        PUT.revert(out, ctx)
        assert not exists(s3_client, S3_PLAIN, "n.txt")

    def test_unversioned_overwrite_cannot_be_undone(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """An overwrite in an unversioned bucket: undo refuses and says the old content is gone."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"old")
        ctx = ctx_for(tmp_path, s3_settings)
        out = PUT.apply(put(S3_PLAIN, "a.txt", "new"), ctx)
        assert out["revertible"] is False
        for attempt in (PUT.revert_preview, PUT.revert):
            with pytest.raises(EffectFailed, match="previous content is gone"):
                attempt(out, ctx)
        assert read(s3_client, S3_PLAIN, "a.txt") == b"new"

    def test_revert_refuses_when_someone_wrote_after(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Undo does not throw away a later write by someone else."""
        ctx = ctx_for(tmp_path, s3_settings)
        out = PUT.apply(put(S3_VERSIONED, "a.txt", "agent"), ctx)
        s3_client.put_object(Bucket=S3_VERSIONED, Key="a.txt", Body=b"later")
        with pytest.raises(EffectFailed, match="changed after this write"):
            PUT.revert(out, ctx)
        assert read(s3_client, S3_VERSIONED, "a.txt") == b"later"

    def test_revert_of_a_delete_removes_the_delete_marker(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Undoing a delete in a versioned bucket brings the object back as it was."""
        old = s3_client.put_object(Bucket=S3_VERSIONED, Key="a.txt", Body=b"keep me")
        ctx = ctx_for(tmp_path, s3_settings)
        params = {"bucket": S3_VERSIONED, "key": "a.txt"}
        assert DELETE.reversible_for(params, ctx) is True
        out = DELETE.apply(params, ctx)
        assert out["deleted"] and out["delete_marker_version_id"]
        assert not exists(s3_client, S3_VERSIONED, "a.txt")
        preview = DELETE.revert_preview(out, ctx)
        assert out["delete_marker_version_id"] in preview.title
        assert preview.body == "keep me"
        DELETE.revert(out, ctx)
        assert read(s3_client, S3_VERSIONED, "a.txt") == b"keep me"
        listed = s3_client.list_object_versions(Bucket=S3_VERSIONED, Prefix="a.txt")
        assert "DeleteMarkers" not in listed
        assert (
            s3_client.head_object(Bucket=S3_VERSIONED, Key="a.txt")["VersionId"]
            == (old["VersionId"])
        )

    def test_unversioned_delete_cannot_be_undone(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """A delete in an unversioned bucket is irreversible, and undo says so."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"bye")
        ctx = ctx_for(tmp_path, s3_settings)
        preview = DELETE.preview({"bucket": S3_PLAIN, "key": "a.txt"}, ctx)
        assert preview.body == "bye" and facts(preview)["undo"].startswith("IRREVERSIBLE")
        out = DELETE.apply({"bucket": S3_PLAIN, "key": "a.txt"}, ctx)
        assert not exists(s3_client, S3_PLAIN, "a.txt")
        with pytest.raises(EffectFailed, match="gone for good"):
            DELETE.revert(out, ctx)

    def test_copy_then_revert(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """A copy over a versioned key is applied, reported, and undone to the old version."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="src.txt", Body=b"from source\n")
        s3_client.put_object(Bucket=S3_VERSIONED, Key="dst.txt", Body=b"before\n")
        ctx = ctx_for(tmp_path, s3_settings)
        params = {
            "bucket": S3_VERSIONED,
            "key": "dst.txt",
            "source_bucket": S3_PLAIN,
            "source_key": "src.txt",
        }
        preview = COPY.preview(params, ctx)
        assert "-before\n" in preview.body and "+from source\n" in preview.body
        out = COPY.apply(params, ctx)
        assert read(s3_client, S3_VERSIONED, "dst.txt") == b"from source\n"
        assert out["source"] == {"bucket": S3_PLAIN, "key": "src.txt", "version_id": None}
        COPY.revert(out, ctx)
        assert read(s3_client, S3_VERSIONED, "dst.txt") == b"before\n"

    def test_output_without_a_target_cannot_be_undone(
        self, tmp_path: Path, s3_settings: dict[str, Any]
    ) -> None:
        """An output that does not name its object is refused with a clear reason."""
        with pytest.raises(EffectFailed, match="does not say which object"):
            PUT.revert({"etag": "x"}, ctx_for(tmp_path, s3_settings))
