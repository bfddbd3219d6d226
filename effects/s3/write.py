"""What s3.put_object and s3.copy_object share: one object written, conditionally,
and undone by removing the version written (or the key that was new)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from broker.errors import EffectFailed
from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context
from effects.s3.clients import clients, object_scope
from effects.s3.conditions import unquote
from effects.s3.handler import ObjectEffect, Undo
from effects.s3.previews import VERSIONING, shown_body, state_facts, write_undo
from effects.s3.state import State, fetch, latest_version, read_state

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class WriteEffect(ObjectEffect):
    """put_object and copy_object: one object written, conditionally, and undoable."""

    reversible = True
    undo = (
        "in a versioned bucket undo removes the version written (the previous one is "
        "current again); a new key in an unversioned bucket is deleted; an overwrite in "
        "an unversioned bucket cannot be undone"
    )

    def _reversible(self, state: State, params: Params) -> bool:
        return write_undo(state, params)[0]

    def _output(
        self, params: Params, answer: Mapping[str, Any], etag: Any, size: int, previous: State
    ) -> JSON:
        version = answer.get("VersionId")
        version = version if version and version != "null" else None
        versioned = previous.versioned and version is not None
        return {
            "bucket": params["bucket"],
            "key": params["key"],
            "etag": etag,
            "version_id": version,
            "bytes": size,
            "versioned": versioned,
            "previous": previous.brief(),
            "revertible": versioned or not previous.exists,
        }

    def _undo(self, output: Mapping[str, Any], ctx: Context) -> Undo:
        bucket, key, target = self._undo_target(output, ctx)
        previous = output.get("previous")
        if not isinstance(previous, Mapping) or "exists" not in previous:
            raise EffectFailed(f"this output does not say what {target} held before")
        reader, _ = clients(ctx, object_scope(bucket, key))
        now = read_state(reader, ctx, bucket, key)
        version = output.get("version_id")
        if output.get("versioned") and version:
            latest = latest_version(reader, ctx, bucket, key)
            if latest != (version, False):
                raise EffectFailed(
                    f"{target} changed after this write (its latest version is "
                    f"{latest[0] if latest else 'gone'}); undoing now would discard that "
                    "change: restore it by hand"
                )
            if previous.get("exists"):
                prev_version = previous.get("version_id") or "null"
                title = (
                    f"remove version {version} of {target}: version {prev_version} is current again"
                )
                restored = State("Enabled", True, size=previous.get("bytes"))
                old = fetch(reader, ctx, bucket, key, restored, prev_version)
            else:
                title = f"remove version {version} of {target}: the key no longer exists, as before"
                old = b""
            preview = self._preview(title, bucket, key, now, old, reader, ctx)
            return Undo(bucket, key, version, None, preview)
        if previous.get("exists"):
            raise EffectFailed(
                f"this write replaced {target} in a bucket without versioning; "
                "the previous content is gone"
            )
        if not now.exists or unquote(now.etag) != unquote(str(output.get("etag"))):
            raise EffectFailed(
                f"{target} changed after this write (it {now.describe()}); undoing now would "
                "delete someone else's change: restore it by hand"
            )
        title = f"delete {target}, which did not exist before this write"
        preview = self._preview(title, bucket, key, now, b"", reader, ctx)
        return Undo(bucket, key, None, now.etag, preview)

    @staticmethod
    def _preview(
        title: str,
        bucket: str,
        key: str,
        now: State,
        restored: bytes | None,
        reader: S3Client,
        ctx: Context,
    ) -> Preview:
        target = f"s3://{bucket}/{key}"
        current = fetch(reader, ctx, bucket, key, now)
        if restored is None:
            body, kind = "(the restored content is binary or too large to show)", "text"
        else:
            body, kind = shown_body(current, restored, target, len(restored))
        return Preview(
            title=title,
            target=f"s3: {target}",
            body=body,
            body_kind=kind,
            facts=(("versioning", VERSIONING[now.versioning]), *state_facts(now)),
        )
