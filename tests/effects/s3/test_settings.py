"""[integrations.s3] and what a request may name: the allowlist, keys, bodies."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from broker.errors import ConfigError, InvalidParams, Rejected
from broker.settings import Settings
from broker.testing import make_context
from tests.effects.conftest import S3_OUTSIDE, S3_PLAIN, S3_REPORTS
from tests.effects.s3.support import COPY, PUT, VALIDATOR, ctx_for, put

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


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

    def test_relative_credential_files_are_read_beside_broker_toml(
        self, tmp_path: Path, s3_endpoint: str, s3_client: S3Client, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """access_key_id_file and secret_access_key_file are read from broker.toml's folder
        at start and at apply, not from the current directory (which lacks them)."""
        etc, elsewhere = tmp_path / "etc", tmp_path / "elsewhere"
        etc.mkdir()
        elsewhere.mkdir()
        (etc / "s3-key-id").write_text("testing-key-id\n")
        (etc / "s3-secret").write_text("testing-secret-key\n")
        monkeypatch.chdir(elsewhere)
        settings = {
            "endpoint_url": s3_endpoint,
            "region": "us-east-1",
            "access_key_id_file": "s3-key-id",
            "secret_access_key_file": "s3-secret",
            "allow": [f"{S3_PLAIN}/*"],
        }
        PUT.check_config(Settings(settings, "integrations.s3", etc))
        with pytest.raises(ConfigError, match=r"integrations\.s3\.access_key_id_file"):
            PUT.check_config(settings)  # a plain table: read from the current directory
        ctx = make_context(settings, integration="s3", config_dir=etc, state_dir=tmp_path)
        out = PUT.apply(put(S3_PLAIN, "from-etc.txt", "x"), ctx)
        assert out["previous"] == {"exists": False}
        assert s3_client.get_object(Bucket=S3_PLAIN, Key="from-etc.txt")["Body"].read() == b"x"


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
