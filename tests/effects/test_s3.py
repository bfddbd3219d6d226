"""s3.put_object, s3.copy_object, s3.delete_object against a real S3 server (moto)."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import string
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
    WaiterError,
)

from broker.approval import decide, nudge
from broker.errors import ConfigError, EffectFailed, InvalidParams, Rejected
from broker.ledger import Ledger
from broker.testing import BrokerHarness, make_context
from broker.validation import Validator
from effects import s3
from effects.base import Context
from tests.effects.conftest import S3_OUTSIDE, S3_PLAIN, S3_REPORTS, S3_VERSIONED

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

PUT, COPY, DELETE = s3.PutObject(), s3.CopyObject(), s3.DeleteObject()
VALIDATOR = Validator({h.name: h.schema for h in (PUT, COPY, DELETE)})


def ctx_for(
    tmp_path: Path,
    settings: dict[str, Any],
    request_id: str = "req-1",
    attachments: dict[str, Path] | None = None,
) -> Context:
    """A Context as the pipeline builds one, with secrets resolved from the environment."""

    return make_context(
        settings,
        integration="s3",
        sandbox="box",
        request_id=request_id,
        request_sha256=hashlib.sha256(request_id.encode()).hexdigest(),
        state_dir=tmp_path / "state",
        attachments=attachments or {},
    )


def read(client: S3Client, bucket: str, key: str) -> bytes:
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def exists(client: S3Client, bucket: str, key: str) -> bool:
    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError:
        return False
    return True


def put(bucket: str, key: str, body: str, **more: Any) -> dict[str, Any]:
    return {"bucket": bucket, "key": key, "body": body, **more}


def facts(preview: Any) -> dict[str, str]:
    return dict(preview.facts)


# -- settings ------------------------------------------------------------------------


class TestSettings:
    def test_literal_secret_is_refused_naming_the_env_form(self) -> None:
        """A secret written in broker.toml stops the start and says to use *_env."""
        with pytest.raises(ConfigError, match=r"integrations\.s3\.secret_access_key: .*_env"):
            PUT.check_config({"secret_access_key": "hunter2"})

    @pytest.mark.parametrize("entry", ["agent-scratch", "agent-scratch/a*b*", "Bad_Bucket/*"])
    def test_malformed_allow_entry_names_its_index(self, entry: str) -> None:
        """An allow entry that is not bucket/prefix* is refused at start, by position."""
        with pytest.raises(ConfigError, match=r"integrations\.s3\.allow\[1\]"):
            PUT.check_config({"allow": ["ok-bucket/*", entry]})

    def test_unset_credential_variable_is_named(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A credentials variable missing from the environment is named at start."""
        monkeypatch.delenv("NO_SUCH_S3_VAR", raising=False)
        with pytest.raises(ConfigError, match="NO_SUCH_S3_VAR"):
            PUT.check_config(
                {"access_key_id_env": "NO_SUCH_S3_VAR", "secret_access_key_env": "NO_SUCH_S3_VAR"}
            )


# -- what a request may name --------------------------------------------------------


class TestRefusals:
    @pytest.mark.parametrize(
        ("bucket", "key", "path", "words"),
        [
            (S3_OUTSIDE, "a.txt", "/params/bucket", "allowed: versioned-scratch/*"),
            (S3_REPORTS, "in/a.txt", "/params/key", "reports/out/*"),
            (S3_PLAIN, "../a.txt", "/params/key", "'..'"),
            (S3_PLAIN, "out/../../a.txt", "/params/key", "'..'"),
            (S3_PLAIN, "/etc/passwd", "/params/key", "start with '/'"),
            (S3_PLAIN, "a\nb", "/params/key", "control characters"),
            (S3_PLAIN, "a\x1b[31mb", "/params/key", "control characters"),
            (S3_PLAIN, "a\x7f", "/params/key", "control characters"),
        ],
    )
    def test_target_outside_the_allowlist_or_path_like_is_invalid(
        self,
        tmp_path: Path,
        s3_settings: dict[str, Any],
        bucket: str,
        key: str,
        path: str,
        words: str,
    ) -> None:
        """Other buckets, other prefixes and path-like keys are `invalid`, naming the param."""
        with pytest.raises(InvalidParams) as caught:
            PUT.check(put(bucket, key, "x"), ctx_for(tmp_path, s3_settings))
        issue = caught.value.issues[0]
        assert issue.path == path
        assert words in issue.message
        assert caught.value.status == "invalid"

    def test_copy_source_outside_the_allowlist_is_invalid(
        self, tmp_path: Path, s3_settings: dict[str, Any]
    ) -> None:
        """A copy may not read from a bucket the host does not allow."""
        params = {"bucket": S3_PLAIN, "key": "a", "source_bucket": S3_OUTSIDE, "source_key": "s"}
        with pytest.raises(InvalidParams) as caught:
            COPY.check(params, ctx_for(tmp_path, s3_settings))
        assert caught.value.issues[0].path == "/params/source_bucket"

    @pytest.mark.parametrize("field", ["acl", "ACL"])
    def test_acl_in_the_request_is_refused_by_the_schema(self, field: str) -> None:
        """No request can set an ACL: the schema refuses `acl` in any case."""
        with pytest.raises(Rejected) as caught:
            VALIDATOR.params("s3.put_object", put(S3_PLAIN, "a", "x", **{field: "public-read"}))
        assert [i.path for i in caught.value.issues] == [f"/params/{field}"]

    def test_two_bodies_are_invalid(self, tmp_path: Path, s3_settings: dict[str, Any]) -> None:
        """A put gives exactly one of body, body_b64 and body_attachment."""
        params = put(S3_PLAIN, "a", "x", body_b64="eA==")
        with pytest.raises(InvalidParams, match="exactly one of body"):
            PUT.check(params, ctx_for(tmp_path, s3_settings))

    def test_unlisted_attachment_is_invalid(
        self, tmp_path: Path, s3_settings: dict[str, Any]
    ) -> None:
        """An attachment name that did not come with the request is invalid, not failed."""
        params = {"bucket": S3_PLAIN, "key": "a", "body_attachment": "blob"}
        with pytest.raises(InvalidParams) as caught:
            PUT.check(params, ctx_for(tmp_path, s3_settings))
        assert caught.value.issues[0].path == "/params/body_attachment"


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


# -- errors at the edge -------------------------------------------------------------


def _client_error(code: str, status: int = 400) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": "m"},
            "ResponseMetadata": {"HTTPStatusCode": status},  # type: ignore[typeddict-item]
        },
        "PutObject",
    )


def _all_botocore_errors() -> list[type[BotoCoreError]]:
    found: list[type[BotoCoreError]] = []
    todo: list[type[BotoCoreError]] = [BotoCoreError]
    while todo:
        kind = todo.pop()
        found.append(kind)
        todo.extend(kind.__subclasses__())
    return sorted(
        {k for k in found if k.__module__ == "botocore.exceptions"}, key=lambda k: k.__name__
    )


def _botocore_error(kind: type[BotoCoreError]) -> BotoCoreError:
    """An instance of any botocore error, its message fields filled with placeholders."""
    fields = {name for _, name, _, _ in string.Formatter().parse(kind.fmt) if name}
    values: dict[str, Any] = dict.fromkeys(fields, "E")
    if issubclass(kind, WaiterError):
        return kind(name="w", reason="r", last_response={})
    return kind(**values)


OP = s3.Op("writing s3://b/k", "b", "k", write=True, conflict="failed: it changed", endpoint="E")
READ = s3.Op("reading s3://b/k", "b", "k", endpoint="E")
GENERIC = "failed: S3 answered"


class TestErrorMapping:
    @pytest.mark.parametrize("code", sorted(s3.REASONS))
    def test_every_mapped_code_has_its_own_reason(self, code: str) -> None:
        """Each S3 error code the handler knows becomes its own actionable sentence."""
        reason = s3.translate(_client_error(code), OP).reason
        assert reason.startswith("failed:") and not reason.startswith(GENERIC)

    @pytest.mark.parametrize(
        ("status", "code"), [("412", "PreconditionFailed"), ("403", "AccessDenied")]
    )
    def test_bodiless_head_errors_map_by_status(self, status: str, code: str) -> None:
        """A HEAD error (no body, code = status) maps like its named code."""
        assert s3.translate(_client_error(status), OP).reason == (
            s3.translate(_client_error(code), OP).reason
        )

    def test_412_says_the_object_changed(self) -> None:
        """A 412 carries the condition owner's sentence."""
        assert s3.translate(_client_error("PreconditionFailed", 412), OP).reason == (
            "failed: it changed"
        )

    def test_unknown_code_is_named(self) -> None:
        """An unmapped code still reaches the agent as a sentence naming code and status."""
        reason = s3.translate(_client_error("WeirdThing", 418), OP).reason
        assert reason.startswith(GENERIC) and "WeirdThing" in reason and "418" in reason

    @pytest.mark.parametrize(("kind", "_"), s3.BOTOCORE_REASONS)
    def test_every_mapped_botocore_error_has_its_own_reason(self, kind: type, _: str) -> None:
        """Each botocore error class handled becomes its own sentence, not the catch-all."""
        reason = s3.translate(_botocore_error(kind), READ).reason
        assert reason.startswith("failed:") and "S3 client failed" not in reason

    @pytest.mark.parametrize("kind", _all_botocore_errors(), ids=lambda k: k.__name__)
    def test_every_botocore_error_becomes_a_sentence(self, kind: type[BotoCoreError]) -> None:
        """No botocore error escapes as a traceback: each is a reason naming no secret."""
        for op in (READ, OP):
            failed = s3.translate(_botocore_error(kind), op)
            assert isinstance(failed, EffectFailed) and failed.reason.startswith("failed:")

    @pytest.mark.parametrize("kind", [ReadTimeoutError, ConnectionClosedError])
    def test_a_write_cut_short_says_it_may_have_happened(self, kind: type) -> None:
        """A timeout during a write tells the agent to check before retrying."""
        assert "may or may not have been made" in s3.translate(_botocore_error(kind), OP).reason

    @pytest.mark.parametrize("kind", [ConnectTimeoutError, EndpointConnectionError])
    def test_connection_failures_say_s3_is_unreachable(self, kind: type) -> None:
        """Connect failures name the endpoint that could not be reached."""
        assert "cannot reach S3 at E" in s3.translate(_botocore_error(kind), OP).reason


# -- through the broker --------------------------------------------------------------


def _decide(h: BrokerHarness, rid: str) -> None:
    ledger = Ledger(h.config.ledger_path)
    try:
        decide(ledger, rid, "approve", approver="alice", reason=None, surface="web", sha256=None)
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
        ep.load().name for ep in entry_points(group="broker.effects") if ep.name.startswith("s3_")
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
        assert list((h.state / "s3" / "seen").iterdir()) == []  # nothing piles up

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
