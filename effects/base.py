"""The handler contract: what a handler receives, returns and may raise.

A handler is an object with:

- `name`: the effect name, `<integration>.<verb>` or `<integration>.<object>.<verb>`.
- `schema`: the JSON Schema (Draft 2020-12) for `params`.
- `reversible`, `idempotent`: honest flags. `reversible` feeds the policy's default
  (reversible effects apply at once); `idempotent` decides what a restart does with
  a request caught mid-apply (re-apply, or `unknown` for a person to reconcile).
- `undo`: one sentence a reviewer reads: how this effect is undone, or that it cannot be.
- `check_config(settings)`: called once at start with `[integrations.<integration>]`;
  raises ConfigError naming the key at fault.
- `check(params, ctx)`: optional checks schema cannot express; raises InvalidParams.
- `reversible_for(params, ctx)`: this request's reversibility (default: `reversible`).
- `inline` (optional, default False): `apply` returns in microseconds and is
  idempotent, so the broker may call it on its own loop, inside the request's commit.
- `idempotent_for(params, ctx)`: may this request be applied again after a crash
  mid-apply? (default: `idempotent`; a GET can say yes where POST cannot).
- `preview(params, ctx) -> Preview`: the literal artefact a person must see.
- `apply(params, ctx) -> dict`: do it, with credentials from `ctx`; return JSON-able
  output for the agent. Raise EffectFailed with a sentence the agent can act on;
  translate the library's exceptions here, `from exc`. Anything else raised is
  reported as a failure with a generic reason and logged on the host.

Handlers never see the sandbox: params are already validated, attachments are
host-side copies, and secrets come only through `ctx.secret`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from broker.errors import ConfigError
from broker.models import Preview
from broker.typing import JSON, Params
from broker.validation import load_schema


@dataclass(frozen=True)
class Context:
    """What a handler may use besides params: host settings, secrets, attachments."""

    sandbox: str
    request_id: str
    request_sha256: str
    settings: Mapping[str, Any]
    state_dir: Path
    secret: Callable[[str], str | None]
    attachment: Callable[[str], Path]


class Handler:
    """A convenient base: declare the flags, implement `preview` and `apply`."""

    name: ClassVar[str] = ""
    reversible: ClassVar[bool] = False
    idempotent: ClassVar[bool] = False
    undo: ClassVar[str] = "cannot be undone by the broker"
    config_keys: ClassVar[frozenset[str]] = frozenset()

    @property
    def schema(self) -> Mapping[str, Any]:
        return load_schema(self.name)

    def check_config(self, settings: Mapping[str, Any]) -> None:
        unknown = set(settings) - self.config_keys
        if unknown:
            section = self.name.split(".", 1)[0]
            raise ConfigError(f"integrations.{section}.{sorted(unknown)[0]}: unknown key")

    def check(self, params: Params, ctx: Context) -> None:
        return None

    def reversible_for(self, params: Params, ctx: Context) -> bool:
        return self.reversible

    def idempotent_for(self, params: Params, ctx: Context) -> bool:
        return self.idempotent

    def preview(self, params: Params, ctx: Context) -> Preview:
        raise NotImplementedError

    def apply(self, params: Params, ctx: Context) -> JSON:
        raise NotImplementedError
