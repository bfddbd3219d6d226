"""What the three s3.* effects share: settings, the allowlist, observing the target
(remembered for apply), and undoing an output with one delete."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker.errors import EffectFailed, InvalidParams
from broker.models import Preview
from broker.typing import JSON, Params
from effects.base import Context, Handler, Scope
from effects.s3.clients import DELETE, clients, endpoint, object_scope
from effects.s3.errors import Op, edge
from effects.s3.seen import Seen, remember
from effects.s3.settings import CONFIG_KEYS, check_settings, check_target, protected
from effects.s3.state import State, read_state


@dataclass(frozen=True)
class Undo:
    """One delete that undoes an output, and what a person sees before it runs."""

    bucket: str
    key: str
    version_id: str | None  # delete this version or marker; None: the key, if still `etag`
    etag: str | None
    preview: Preview


class ObjectEffect(Handler):
    """What the three effects share: settings, the allowlist, observing, undoing."""

    idempotent = False  # a re-run conditional write would fail as a conflict
    config_keys = CONFIG_KEYS

    def check_config(self, settings: Mapping[str, Any]) -> None:
        check_settings(settings)

    def check(self, params: Params, ctx: Context) -> None:
        check_target(ctx.settings, params["bucket"], params["key"])
        if "if_match" in params and "if_none_match" in params:
            raise InvalidParams(
                "/params/if_none_match", "give if_match or if_none_match, not both", "conflict"
            )

    def protected_for(self, params: Params, ctx: Context) -> Sequence[str]:
        """The written (or deleted) `bucket/key` if protected_keys names it."""
        return protected(ctx.settings, params["bucket"], params["key"])

    def reversible_for(self, params: Params, ctx: Context) -> bool:
        try:
            state = self._observe(params, ctx, "policy")
        except EffectFailed:
            return False  # fail closed: a person sees the preview, or why it failed
        return self._reversible(state, params)

    def _observe(self, params: Params, ctx: Context, stage: str) -> State:
        reader, _ = clients(ctx, self._reads(params))
        state = read_state(reader, ctx, params["bucket"], params["key"])
        remember(ctx, Seen(stage, state))
        return state

    def _reversible(self, state: State, params: Params) -> bool:
        raise NotImplementedError

    def _reads(self, params: Params) -> Scope:
        """What observing the request's target needs (a preview, an assessment)."""
        return object_scope(params["bucket"], params["key"])

    def revert_preview(self, output: Mapping[str, Any], ctx: Context) -> Preview:
        """What `revert` will do to this output, computed from S3 as it is now."""
        return self._undo(output, ctx).preview

    def revert(self, output: Mapping[str, Any], ctx: Context) -> JSON:
        """Undo what `apply` returned as `output`; EffectFailed when it cannot be undone."""
        undo = self._undo(output, ctx)
        reader, writer = clients(ctx, object_scope(undo.bucket, undo.key, DELETE))
        target = f"s3://{undo.bucket}/{undo.key}"
        op = Op(
            f"undoing {self.name} on {target}",
            undo.bucket,
            undo.key,
            write=True,
            conflict=f"failed: {target} changed since the undo was planned; nothing was undone",
            endpoint=endpoint(ctx),
        )
        with edge(op):
            if undo.version_id:
                writer.delete_object(Bucket=undo.bucket, Key=undo.key, VersionId=undo.version_id)
            else:
                writer.delete_object(Bucket=undo.bucket, Key=undo.key, IfMatch=undo.etag or "*")
        now = read_state(reader, ctx, undo.bucket, undo.key)
        return {
            "bucket": undo.bucket,
            "key": undo.key,
            "undid": self.name,
            "removed_version_id": undo.version_id,
            "now": now.brief(),
        }

    def _undo(self, output: Mapping[str, Any], ctx: Context) -> Undo:
        raise NotImplementedError

    @staticmethod
    def _undo_target(output: Mapping[str, Any], ctx: Context) -> tuple[str, str, str]:
        bucket, key = output.get("bucket"), output.get("key")
        if not isinstance(bucket, str) or not isinstance(key, str):
            raise EffectFailed("this output does not say which object it wrote (bucket, key)")
        try:
            check_target(ctx.settings, bucket, key)
        except InvalidParams as exc:
            raise EffectFailed(
                f"s3://{bucket}/{key} is no longer allowed on this host ({exc.issues[0].message})"
            ) from exc
        return bucket, key, f"s3://{bucket}/{key}"
