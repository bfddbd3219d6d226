"""s3.delete_object: delete one object; in a versioned bucket that leaves a delete
marker, and undo removes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.errors import EffectFailed
from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context
from effects.s3.clients import DELETE, clients, endpoint, object_scope
from effects.s3.conditions import condition
from effects.s3.errors import Op, edge
from effects.s3.handler import ObjectEffect, Undo
from effects.s3.previews import VERSIONING, as_text, condition_fact, state_facts
from effects.s3.seen import recall
from effects.s3.settings import check_target
from effects.s3.state import State, fetch, latest_version, read_state


class DeleteObject(ObjectEffect):
    """Delete one object; in a versioned bucket that leaves a delete marker, undoable."""

    name = "s3.delete_object"
    identifying = ("bucket", "key")
    reversible = False  # per request: reversible in a versioned bucket
    undo = (
        "in a versioned bucket undo removes the delete marker, so the object is back; "
        "in an unversioned bucket the object is gone for good"
    )

    def _reversible(self, state: State, params: Params) -> bool:
        return state.versioned or not state.exists

    def preview(self, params: Params, ctx: Context) -> Preview:
        bucket, key = params["bucket"], params["key"]
        target = f"s3://{bucket}/{key}"
        state = self._observe(params, ctx, "approver")
        facts = [("versioning", VERSIONING[state.versioning]), *state_facts(state)]
        facts += condition_fact(params, state)
        if not state.exists:
            return Preview(
                title=f"delete {target}: it does not exist, nothing will happen",
                target=f"s3: {target}",
                facts=tuple(facts),
            )
        if state.versioned:
            facts.append(("undo", "reversible: undo removes the delete marker"))
        else:
            facts.append(("undo", "IRREVERSIBLE: the bucket keeps no versions"))
        reader, _ = clients(ctx, self._reads(params))
        current = as_text(fetch(reader, ctx, bucket, key, state))
        return Preview(
            title=f"delete {target} ({state.size} bytes)",
            target=f"s3: {target}",
            body=current if current is not None else f"({state.size} bytes: not shown)",
            facts=tuple(facts),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        bucket, key = params["bucket"], params["key"]
        check_target(ctx.settings, bucket, key)
        target = f"s3://{bucket}/{key}"
        reader, writer = clients(ctx, object_scope(bucket, key, DELETE))
        now = read_state(reader, ctx, bucket, key)
        cond, conflict = condition(target, params, recall(ctx), now)
        out: JSON = {"bucket": bucket, "key": key, "versioned": now.versioned}
        if "IfNoneMatch" in cond:  # it did not exist when seen: there is nothing to delete
            if now.exists:
                raise EffectFailed(conflict)
            return {**out, "deleted": False, "previous": now.brief(), "revertible": False}
        op = Op(f"deleting {target}", bucket, key, True, conflict, endpoint(ctx))
        with edge(op):
            answer = writer.delete_object(Bucket=bucket, Key=key, IfMatch=cond["IfMatch"])
        marker = answer.get("VersionId") if answer.get("DeleteMarker") else None
        return {
            **out,
            "deleted": True,
            "delete_marker_version_id": marker,
            "previous": now.brief(),
            "revertible": bool(now.versioned and marker),
        }

    def _undo(self, output: Mapping[str, Any], ctx: Context) -> Undo:
        bucket, key, target = self._undo_target(output, ctx)
        if not output.get("deleted"):
            raise EffectFailed(f"nothing to undo: {target} did not exist when it was deleted")
        marker = output.get("delete_marker_version_id")
        if not (output.get("versioned") and marker):
            raise EffectFailed(
                f"{target} was deleted from a bucket without versioning; it is gone for good"
            )
        reader, _ = clients(ctx, object_scope(bucket, key))
        latest = latest_version(reader, ctx, bucket, key)
        if latest != (marker, True):
            raise EffectFailed(
                f"{target} changed after the delete (its latest version is "
                f"{latest[0] if latest else 'gone'}); restore it by hand"
            )
        previous = output.get("previous") or {}
        version = previous.get("version_id") or "null"  # "null": written before versioning
        restored = State("Enabled", True, size=previous.get("bytes"))
        text = as_text(fetch(reader, ctx, bucket, key, restored, version))
        preview = Preview(
            title=f"remove the delete marker {marker} of {target}: version {version} is current "
            "again",
            target=f"s3: {target}",
            body=text if text is not None else "(the restored content is binary or too large)",
            facts=(
                ("restored version", version),
                ("restored ETag", str(previous.get("etag"))),
                ("restored size", f"{previous.get('bytes')} bytes"),
            ),
        )
        return Undo(bucket, key, str(marker), None, preview)
