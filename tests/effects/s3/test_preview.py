"""Reversibility per request (versioning, existence) and what the approver sees."""

from __future__ import annotations

import base64
import hashlib
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from broker.errors import EffectFailed
from tests.effects.conftest import S3_PLAIN, S3_VERSIONED
from tests.effects.s3.support import DELETE, PUT, ctx_for, facts, put

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


# -- reversibility and preview ------------------------------------------------------


class TestReversibility:
    @pytest.mark.parametrize(
        ("handler", "bucket", "existing", "reversible"),
        [
            (PUT, S3_VERSIONED, True, True),
            (PUT, S3_PLAIN, False, True),
            (PUT, S3_PLAIN, True, False),
            (DELETE, S3_VERSIONED, True, True),
            (DELETE, S3_PLAIN, True, False),
            (DELETE, S3_PLAIN, False, True),
        ],
    )
    def test_reversibility_follows_versioning_and_existence(
        self,
        tmp_path: Path,
        s3_settings: dict[str, Any],
        s3_client: S3Client,
        handler: Any,
        bucket: str,
        existing: bool,
        reversible: bool,
    ) -> None:
        """Versioned: reversible; unversioned: only a new key (or a missing one) is."""
        if existing:
            s3_client.put_object(Bucket=bucket, Key="k.txt", Body=b"old")
        params = (
            put(bucket, "k.txt", "new") if handler is PUT else {"bucket": bucket, "key": "k.txt"}
        )
        assert handler.reversible_for(params, ctx_for(tmp_path, s3_settings)) is reversible

    def test_unreachable_s3_is_not_called_reversible(
        self, tmp_path: Path, s3_settings: dict[str, Any]
    ) -> None:
        """When S3 cannot be reached at intake, the request goes to a person, not auto."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        settings = {**s3_settings, "endpoint_url": f"http://127.0.0.1:{port}"}
        assert PUT.reversible_for(put(S3_VERSIONED, "a", "x"), ctx_for(tmp_path, settings)) is False
        with pytest.raises(EffectFailed, match=r"cannot reach S3 at http://127\.0\.0\.1"):
            PUT.apply(put(S3_VERSIONED, "a", "x"), ctx_for(tmp_path, settings))


class TestPreview:
    def test_overwrite_shows_size_etag_version_and_a_diff(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """The approver sees the live object's size, ETag and version, and a text diff."""
        old = s3_client.put_object(Bucket=S3_VERSIONED, Key="notes.txt", Body=b"one\ntwo\n")
        preview = PUT.preview(
            put(S3_VERSIONED, "notes.txt", "one\nthree\n"), ctx_for(tmp_path, s3_settings)
        )
        shown = facts(preview)
        assert preview.title.startswith("overwrite s3://versioned-scratch/notes.txt")
        assert shown["current size"] == "8 bytes"
        assert shown["current ETag"] == old["ETag"]
        assert shown["current version"] == old["VersionId"]
        assert shown["undo"].startswith("reversible")
        assert preview.body_kind == "diff"
        assert "-two\n" in preview.body and "+three\n" in preview.body

    def test_unversioned_overwrite_preview_warns_it_is_irreversible(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Overwriting in an unversioned bucket is flagged IRREVERSIBLE to the approver."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"old")
        preview = PUT.preview(put(S3_PLAIN, "a.txt", "new"), ctx_for(tmp_path, s3_settings))
        assert facts(preview)["undo"].startswith("IRREVERSIBLE")
        assert facts(preview)["current version"] == "none (unversioned)"

    def test_new_key_preview_shows_the_content(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """A new key is shown as such, with its content, size and sha256."""
        preview = PUT.preview(put(S3_PLAIN, "new.txt", "hello\n"), ctx_for(tmp_path, s3_settings))
        shown = facts(preview)
        assert shown["exists"] == "no: a new object"
        assert shown["new size"] == "6 bytes"
        assert shown["new sha256"] == hashlib.sha256(b"hello\n").hexdigest()
        assert (preview.body, preview.body_kind) == ("hello\n", "text")

    def test_binary_body_is_described_not_shown(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """Binary bytes are not dumped into the preview; their size and digest are."""
        blob = b"\x00\xff" * 10
        params = {"bucket": S3_PLAIN, "key": "b.bin", "body_b64": base64.b64encode(blob).decode()}
        preview = PUT.preview(params, ctx_for(tmp_path, s3_settings))
        assert "binary" in preview.body
        assert facts(preview)["new sha256"] == hashlib.sha256(blob).hexdigest()

    def test_failing_if_match_is_shown(
        self, tmp_path: Path, s3_settings: dict[str, Any], s3_client: S3Client
    ) -> None:
        """An agent's if_match that no longer holds is flagged in the preview."""
        s3_client.put_object(Bucket=S3_PLAIN, Key="a.txt", Body=b"old")
        params = put(S3_PLAIN, "a.txt", "new", if_match='"0123"')
        preview = PUT.preview(params, ctx_for(tmp_path, s3_settings))
        assert facts(preview)["condition"].startswith('if_match "0123": FAILS now')
