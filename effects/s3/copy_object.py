"""s3.copy_object: copy one object onto a key; both sides must be in the allowlist, and
the source must still be what the approver saw."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.errors import EffectFailed
from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context, Scope
from effects.s3.clients import PUT, clients, endpoint, object_scope
from effects.s3.conditions import condition, holds, unquote
from effects.s3.errors import Op, edge
from effects.s3.previews import VERSIONING, condition_fact, shown_body, state_facts, write_undo
from effects.s3.seen import Seen, recall, remember
from effects.s3.settings import check_target
from effects.s3.state import State, fetch, read_state
from effects.s3.write import WriteEffect

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CopySourceTypeDef


class CopyObject(WriteEffect):
    """Copy one object onto a key; both sides must be in the allowlist."""

    name = "s3.copy_object"
    identifying = ("bucket", "key", "source_bucket", "source_key", "source_version_id")

    def check(self, params: Params, ctx: Context) -> None:
        super().check(params, ctx)
        check_target(ctx.settings, params["source_bucket"], params["source_key"], "source_")

    def _source(self, params: Params, ctx: Context, reader: S3Client) -> State:
        bucket, key = params["source_bucket"], params["source_key"]
        state = read_state(reader, ctx, bucket, key, params.get("source_version_id"))
        if not state.exists:
            raise EffectFailed(f"failed: the source s3://{bucket}/{key} does not exist")
        return state

    def _reads(self, params: Params) -> Scope:
        source = (params["source_bucket"], params["source_key"])
        return object_scope(params["bucket"], params["key"], source=source)

    def _writes(self, params: Params) -> Scope:
        source = (params["source_bucket"], params["source_key"])
        return object_scope(params["bucket"], params["key"], PUT, source)

    def _observe(self, params: Params, ctx: Context, stage: str) -> State:
        return self._observe_both(params, ctx, stage)[0]

    def _observe_both(self, params: Params, ctx: Context, stage: str) -> tuple[State, State]:
        reader, _ = clients(ctx, self._reads(params))
        source = self._source(params, ctx, reader)
        state = read_state(reader, ctx, params["bucket"], params["key"])
        remember(ctx, Seen(stage, state, source))
        return state, source

    def preview(self, params: Params, ctx: Context) -> Preview:
        bucket, key = params["bucket"], params["key"]
        target = f"s3://{bucket}/{key}"
        source_name = f"s3://{params['source_bucket']}/{params['source_key']}"
        state, source = self._observe_both(params, ctx, "approver")
        reader, _ = clients(ctx, self._reads(params))
        new = fetch(
            reader, ctx, params["source_bucket"], params["source_key"], source, source.version_id
        )
        old = fetch(reader, ctx, bucket, key, state)
        shown, kind = shown_body(old, new, target, source.size or 0)
        facts = [
            ("source", source_name),
            ("source size", f"{source.size} bytes"),
            ("source ETag", str(source.etag)),
            ("source version", source.version_id or "none (unversioned)"),
            ("versioning", VERSIONING[state.versioning]),
            *state_facts(state),
            *condition_fact(params, state),
            ("undo", write_undo(state, params)[1]),
        ]
        verb = "overwrite" if state.exists else "create"
        return Preview(
            title=f"{verb} {target} with a copy of {source_name} ({source.size} bytes)",
            target=f"s3: {target}",
            body=shown,
            body_kind=kind,
            facts=tuple(facts),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        bucket, key = params["bucket"], params["key"]
        check_target(ctx.settings, bucket, key)
        check_target(ctx.settings, params["source_bucket"], params["source_key"], "source_")
        target = f"s3://{bucket}/{key}"
        reader, writer = clients(ctx, self._writes(params))
        seen = recall(ctx)
        source = self._source(params, ctx, reader)
        was = seen.source if seen is not None and seen.stage == "approver" else None
        if seen is not None and was is not None and unquote(was.etag) != unquote(source.etag):
            raise EffectFailed(
                f"failed: the source s3://{params['source_bucket']}/{params['source_key']} "
                f"changed since {seen.who} (then it {was.describe()}); send the request again"
            )
        now = read_state(reader, ctx, bucket, key)
        cond, conflict = condition(target, params, seen, now)
        if not holds(cond, now):  # moto ignores CopyObject's destination conditions
            raise EffectFailed(conflict)
        copy_source: CopySourceTypeDef = {
            "Bucket": params["source_bucket"],
            "Key": params["source_key"],
        }
        if source.version_id:
            copy_source["VersionId"] = source.version_id
        extra: dict[str, Any] = {"CopySourceIfMatch": source.etag or "*", **cond}
        if "content_type" in params or "metadata" in params:
            extra["MetadataDirective"] = "REPLACE"
            kind = params.get("content_type") or source.content_type
            extra["ContentType"] = kind or "application/octet-stream"
            extra["Metadata"] = dict(params.get("metadata") or {})
        op = Op(f"copying onto {target}", bucket, key, True, conflict, endpoint(ctx))
        with edge(op):
            answer = writer.copy_object(
                Bucket=bucket,
                Key=key,
                CopySource=copy_source,
                **extra,
            )
        etag = answer.get("CopyObjectResult", {}).get("ETag")
        return {
            **self._output(params, answer, etag, source.size or 0, now),
            "source": {
                "bucket": params["source_bucket"],
                "key": params["source_key"],
                "version_id": source.version_id,
            },
        }
