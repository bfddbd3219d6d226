"""s3.put_object: write one object from inline text, base64 bytes or an attachment."""

from __future__ import annotations

import json
from typing import Any

from broker.errors import InvalidParams
from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context
from effects.s3.bodies import Body, attachment_path, decode_b64
from effects.s3.clients import PUT, clients, endpoint, object_scope
from effects.s3.conditions import condition
from effects.s3.errors import Op, edge
from effects.s3.previews import VERSIONING, condition_fact, shown_body, state_facts, write_undo
from effects.s3.seen import recall
from effects.s3.settings import check_target
from effects.s3.state import fetch, read_state
from effects.s3.write import WriteEffect


class PutObject(WriteEffect):
    """Write one object: inline text, base64 bytes, or an attachment."""

    name = "s3.put_object"
    identifying = ("bucket", "key")

    def check(self, params: Params, ctx: Context) -> None:
        super().check(params, ctx)
        given = [f for f in ("body", "body_b64", "body_attachment") if f in params]
        if len(given) != 1:
            raise InvalidParams(
                "/params/body",
                "give exactly one of body (text), body_b64 (base64) or body_attachment "
                f"(an attachment's name); got {', '.join(given) or 'none'}",
                "one_body",
            )
        if "body_b64" in params:
            decode_b64(str(params["body_b64"]))
        if "body_attachment" in params:
            attachment_path(params, ctx)
        metadata = params.get("metadata") or {}
        if sum(len(k) + len(str(v)) for k, v in metadata.items()) > 2048:
            raise InvalidParams("/params/metadata", "metadata is larger than S3's 2 KB", "too_big")

    def preview(self, params: Params, ctx: Context) -> Preview:
        bucket, key = params["bucket"], params["key"]
        target = f"s3://{bucket}/{key}"
        state = self._observe(params, ctx, "approver")
        body = Body.of(params, ctx)
        reader, _ = clients(ctx, self._reads(params))
        shown, kind = shown_body(
            fetch(reader, ctx, bucket, key, state), body.head(), target, body.size
        )
        facts = [("versioning", VERSIONING[state.versioning]), *state_facts(state)]
        facts += [
            ("new size", f"{body.size} bytes"),
            ("new sha256", body.sha256),
            ("content type", body.content_type),
        ]
        if params.get("metadata"):
            facts.append(("metadata", json.dumps(params["metadata"], sort_keys=True)))
        facts += condition_fact(params, state)
        facts.append(("undo", write_undo(state, params)[1]))
        verb = "overwrite" if state.exists else "create"
        return Preview(
            title=f"{verb} {target} ({body.size} bytes)",
            target=f"s3: {target}",
            body=shown,
            body_kind=kind,
            facts=tuple(facts),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        bucket, key = params["bucket"], params["key"]
        check_target(ctx.settings, bucket, key)  # the allowlist may have shrunk since intake
        target = f"s3://{bucket}/{key}"
        body = Body.of(params, ctx)
        reader, writer = clients(ctx, object_scope(bucket, key, PUT))
        now = read_state(reader, ctx, bucket, key)
        cond, conflict = condition(target, params, recall(ctx), now)
        extra: dict[str, Any] = {"ContentType": body.content_type, **cond}
        if params.get("metadata"):
            extra["Metadata"] = dict(params["metadata"])
        op = Op(f"writing {target}", bucket, key, True, conflict, endpoint(ctx))
        with edge(op), body.stream() as data:
            answer = writer.put_object(Bucket=bucket, Key=key, Body=data, **extra)
        return {
            **self._output(params, answer, answer.get("ETag"), body.size, now),
            "sha256": body.sha256,
        }
