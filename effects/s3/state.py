"""An object as the broker saw it (its bucket's versioning, its current version), read
from S3; the versions a key has; the bytes of one small enough to show."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.typing import JSON
from effects.base import Context
from effects.s3.clients import endpoint
from effects.s3.errors import Op, edge, error_code

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

SHOW_MAX = 256 * 1024  # larger objects are described, not shown or diffed


@dataclass(frozen=True)
class State:
    """An object as the broker saw it: its bucket's versioning and its current version."""

    versioning: str  # Enabled | Suspended | off | unknown (the host may not read it)
    exists: bool
    etag: str | None = None
    version_id: str | None = None
    size: int | None = None
    content_type: str | None = None

    @property
    def versioned(self) -> bool:
        return self.versioning == "Enabled"

    def describe(self) -> str:
        if not self.exists:
            return "did not exist"
        version = f", version {self.version_id}" if self.version_id else ""
        return f"had ETag {self.etag}{version}"

    def brief(self) -> JSON:
        """What an output says about the object: enough to undo, nothing more."""
        if not self.exists:
            return {"exists": False}
        return {
            "exists": True,
            "etag": self.etag,
            "version_id": self.version_id,
            "bytes": self.size,
        }

    def to_json(self) -> JSON:
        return {**self.brief(), "versioning": self.versioning, "content_type": self.content_type}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> State:
        return cls(
            versioning=str(data["versioning"]),
            exists=bool(data["exists"]),
            etag=data.get("etag"),
            version_id=data.get("version_id"),
            size=data.get("bytes"),
            content_type=data.get("content_type"),
        )


def read_state(
    reader: S3Client, ctx: Context, bucket: str, key: str, version_id: str | None = None
) -> State:
    """The bucket's versioning and the key's current (or given) version, from S3."""
    from botocore.exceptions import ClientError

    op = Op(f"reading s3://{bucket}/{key}", bucket, key, endpoint=endpoint(ctx))
    with edge(op):
        versioning: str
        try:
            versioning = reader.get_bucket_versioning(Bucket=bucket).get("Status") or "off"
        except ClientError as exc:
            if error_code(exc) != "AccessDenied":
                raise
            versioning = "unknown"
        try:
            if version_id:
                head = reader.head_object(Bucket=bucket, Key=key, VersionId=version_id)
            else:
                head = reader.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if error_code(exc) == "NoSuchKey":
                return State(versioning, exists=False)
            raise
    return State(
        versioning,
        exists=True,
        etag=head.get("ETag"),
        version_id=head.get("VersionId"),
        size=head.get("ContentLength"),
        content_type=head.get("ContentType"),
    )


def latest_version(
    reader: S3Client, ctx: Context, bucket: str, key: str
) -> tuple[str, bool] | None:
    """(version id, is a delete marker) of the key's latest version, or None."""
    op = Op(f"listing the versions of s3://{bucket}/{key}", bucket, key, endpoint=endpoint(ctx))
    with edge(op):
        listing = reader.list_object_versions(Bucket=bucket, Prefix=key)
    for entry in listing.get("Versions", []):
        if entry.get("Key") == key and entry.get("IsLatest"):
            return str(entry.get("VersionId")), False
    for marker in listing.get("DeleteMarkers", []):
        if marker.get("Key") == key and marker.get("IsLatest"):
            return str(marker.get("VersionId")), True
    return None


def fetch(
    reader: S3Client, ctx: Context, bucket: str, key: str, state: State, version: str | None = None
) -> bytes | None:
    """The object's bytes when it is small enough to show, else None."""
    if not state.exists or state.size is None or state.size > SHOW_MAX:
        return None

    op = Op(f"reading s3://{bucket}/{key}", bucket, key, endpoint=endpoint(ctx))
    with edge(op):
        if version:
            got = reader.get_object(Bucket=bucket, Key=key, VersionId=version)
        else:
            got = reader.get_object(Bucket=bucket, Key=key)
        with got["Body"] as stream:
            return stream.read(SHOW_MAX + 1)
