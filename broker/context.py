"""The Context a handler gets for one recorded request, built in one place.

Secrets resolve through the config (beside broker.toml), attachments from the
content-addressed store, and what a handler remembers (`ctx.remember`) is held in a
`Memo` that the broker stores with the request and drops when the request ends.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from broker import attachments
from broker.config import Config
from broker.errors import EffectFailed
from broker.grants import Grants, Provider, provider_for
from broker.masking import Masker
from effects.base import Context

if TYPE_CHECKING:
    from pathlib import Path

    from broker.models import Record


class Memo:
    """What a handler remembered about one request: what the broker stored, and what
    this call remembered anew (the broker stores that with the request's next state)."""

    def __init__(self, stored: Mapping[str, Any] | None = None) -> None:
        self.stored = dict(stored) if stored is not None else None
        self.new: dict[str, Any] | None = None

    @property
    def changed(self) -> bool:
        return self.new is not None

    def remember(self, data: Mapping[str, Any]) -> None:
        self.new = dict(data)

    def recall(self) -> dict[str, Any] | None:
        return self.new if self.new is not None else self.stored


def context_for(config: Config, record: Record, memo: Memo | None = None) -> Context:
    """What a handler gets besides params, for one recorded request. Whoever calls a
    handler that may reach a service with it closes `ctx.grants` after (`opened`)."""
    integration = (record.effect or "").split(".", 1)[0]
    memo = memo if memo is not None else Memo(record.seen)
    made: list[Provider | None] = []

    def provider() -> Provider | None:
        if not made:
            made.append(provider_for(config.integration(integration), config.credentials))
        return made[0]

    def secret(key: str) -> str | None:
        return config.secret(integration, key)

    def attachment(name: str) -> Path:
        digest = (record.envelope.get("attachments") or {}).get(name)
        if not digest:
            raise EffectFailed(f"failed: no attachment named {name!r} came with the request")
        return attachments.path(config.state_dir, str(digest))

    return Context(
        sandbox=record.sandbox,
        request_id=record.id,
        request_sha256=record.sha256 or "",
        settings=config.integration(integration),
        state_dir=config.state_dir,
        repositories=config.repositories,
        secret=secret,
        attachment=attachment,
        remember=memo.remember,
        recall=memo.recall,
        grants=Grants(provider, f"{record.sandbox}/{record.id} {(record.sha256 or '')[:12]}"),
    )


@contextmanager
def opened(config: Config, record: Record, memo: Memo | None = None) -> Iterator[Context]:
    """A Context for one handler call that may reach a service; what it minted is
    revoked when the call ends, however it ends."""
    ctx = context_for(config, record, memo)
    assert ctx.grants is not None
    try:
        yield ctx
    except EffectFailed as exc:
        raise masked_failure(exc, ctx.grants.secrets()) from exc.__cause__
    finally:
        ctx.grants.close()


def masked_failure(exc: EffectFailed, minted: Sequence[str]) -> EffectFailed:
    """`exc` with what the call minted masked in its reason and issues, in place: a
    service's refusal may echo the credential it was sent (git prints its Basic form),
    and the broker's redaction knows only the standing secrets of broker.toml."""
    if minted:
        mask = Masker(minted).text
        exc.reason = mask(exc.reason)
        exc.args = (exc.reason,)
        exc.issues = tuple(i._replace(message=mask(i.message)) for i in exc.issues)
    return exc
