"""The handler contract, in full: the one import a plugin author needs.

    from effects.base import Handler, Context, Preview, EffectFailed, InvalidParams

A handler is an object the broker calls for one effect. It never sees the sandbox:
params are already validated against its schema, attachments are host-side copies,
secrets come only through `ctx.credential` (minted for this call) or `ctx.secret`
(standing). The broker calls, in this order:

    check_config(settings)          once, at start
    canonical(params, ctx)          on the loop, right after the params schema
    check(params, ctx)              on the loop, while the request is recorded
    reversible_for(params, ctx)     on the loop if `assess_inline`, else on a worker
    protected_for(params, ctx)      beside reversible_for: the protected paths it touches
    preview(params, ctx)            on a worker, with a deadline, if a person must decide
    apply(params, ctx)              on a worker (on the loop if `inline`)
    idempotent_for(params, ctx)     before apply, and after a crash mid-apply
    revert_preview / revert         `broker undo`, for handlers that can undo

Required members (the registry refuses a handler without them):

- `name: str`: `<integration>.<verb>` or `<integration>.<object>.<verb>`, lower case.
  The integration (the first part) names the `[integrations.<integration>]` section.
- `schema: Mapping`: the JSON Schema (Draft 2020-12) for `params`. `Handler` finds it
  by name: `schemas/<name>.json` beside the handler's module, else the broker's own.
- `reversible: bool`, `idempotent: bool`: honest flags. `reversible` feeds the
  policy's default (reversible effects apply at once); `idempotent` decides what a
  restart does with a request caught mid-apply (re-apply, or `unknown` for a person).
- `undo: str`: one sentence a reviewer reads: how the effect is undone, or that it
  cannot be.
- `preview(params, ctx) -> Preview`: the literal artefact a person must see (the
  exact diff, body, destination), never a summary. May call the service (it runs off
  the loop, bounded by a deadline); what it observed and `apply` must re-check goes
  to `ctx.remember`. Raise EffectFailed to show why no preview could be made.
- `apply(params, ctx) -> dict`: do it, with credentials from `ctx.secret`; return
  JSON-able output for the agent. Raise EffectFailed (or InvalidParams) with a
  sentence the agent can act on, translating the library's exceptions here,
  `from exc`. Anything else raised is reported as a failure with a generic reason
  and logged on the host.

Optional members (absent: the default below; present: the registry checks the type):

- `check_config(settings) -> None`: validate `[integrations.<integration>]`; raise
  ConfigError naming the key. Default: accept anything.
- `canonical(params, ctx) -> Params`: the one form of these params (paths without
  `./`, `//` or a trailing `/`, keys and refs as the service spells them, URLs with
  their host lower-cased and dot segments resolved). Return the params rewritten into
  that form, or raise InvalidParams for input with no single meaning. The broker
  records the canonical request, and its sha256 is what the agent's result, the
  policy, the preview, the approval and `apply` all see: a rule on `path = "bin/*"`
  cannot be stepped around with `./bin/x`. Must not call a service. Default: the
  params as they came.
- `check(params, ctx) -> None`: what the schema cannot express; raise InvalidParams.
  Must not call a service: it runs while the ledger's write lock is held.
- `reversible_for(params, ctx) -> bool`: this request's reversibility (an S3 put
  over an unversioned object is not). Default: `reversible`.
- `assess_inline: bool`: `reversible_for` reads only local state and returns at once,
  so the broker may call it on its loop. Default False for a handler with a
  `reversible_for` of its own: it runs on a worker with a deadline, and a request whose
  assessment breaks or times out is treated as irreversible (never applied on a
  guess). A handler without its own `reversible_for` or `protected_for` is assessed
  on the loop.
- `protected_for(params, ctx) -> Sequence[str]`: the protected paths (or keys) this
  request's change touches, by the host's configuration (`protected_paths`). When it
  returns any, a person must approve the request whatever the rules say, unless the
  rule that matched names each of them in its own `protected_paths`; a deny rule still
  denies. Runs where `reversible_for` runs (so declare `assess_inline` only when both
  read local state). Default: none.
- `idempotent_for(params, ctx) -> bool`: may this request be applied again after a
  crash mid-apply? (A GET may, a POST may not.) Default: `idempotent`.
- `inline: bool`: `apply` returns in microseconds, touches only local state and is
  idempotent, so the broker may call it on its loop, inside the request's commit.
  Default False.
- `returns(settings) -> Mapping[str, str]`: what of a service's answer comes back to
  the sandbox, per target the host names (a destination's `response = ...`), in one
  sentence each; published in the effect catalogue (`outbox effects`). Default: {}.
- `identifying: tuple[str, ...] | None`: the params that pick the target or the data
  (source and destination, path, issue and labels, head and base, recipients): a rule
  drafted from one approval names each of them. Default None: every param.
- `revert_preview(output, ctx) -> Preview` and `revert(output, ctx) -> dict`: both or
  neither; `broker undo` shows the first and calls the second with what `apply`
  returned.

Test a handler with `broker.testing.make_context()`, which builds a real Context.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from broker.errors import ConfigError, CredentialRefused, EffectFailed, InvalidParams
from broker.grants import Grant, Grants, Scope
from broker.models import Preview
from broker.repositories import Repositories
from broker.settings import Settings, only_keys
from broker.typing import JSON, Params
from broker.validation import load_schema

__all__ = [
    "JSON",
    "OPTIONAL_FLAGS",
    "OPTIONAL_METHODS",
    "REQUIRED_FLAGS",
    "REQUIRED_METHODS",
    "ConfigError",
    "Context",
    "CredentialRefused",
    "EffectFailed",
    "EffectHandler",
    "Grant",
    "Handler",
    "InvalidParams",
    "Params",
    "Preview",
    "Revertible",
    "Scope",
    "Settings",
    "optional_setting",
    "reject_unknown_keys",
]


@dataclass(frozen=True)
class Context:
    """What a handler may use besides params, for one request.

    `settings` is the integration's table of broker.toml (`Settings`, a read-only
    mapping). `secret(key)` resolves `<key>_env` / `<key>_file` in it (a dotted key
    reaches a nested table: `remotes.origin.token`), relative files beside broker.toml;
    in `check_config`, where there is no context, `Settings.of(settings, where).secret`
    does the same. `attachment(name)` is the host-side path of an attachment the
    request listed. `remember(data)` keeps what a preview showed (or an assessment
    observed) with the request, and `recall()` returns it at apply: the broker stores
    it with the request and drops it when the request ends.

    `credential(scope)` is the credential of this call, minted for exactly `scope` by
    the provider the integration names and revoked when the call ends; None when it
    names none (use `secret`: a standing credential). A provider that cannot mint
    raises CredentialRefused: let it through, never fall back to a static secret.
    """

    sandbox: str
    request_id: str
    request_sha256: str
    settings: Mapping[str, Any]
    state_dir: Path
    secret: Callable[[str], str | None]
    attachment: Callable[[str], Path]
    remember: Callable[[Mapping[str, Any]], None]
    recall: Callable[[], dict[str, Any] | None]
    repositories: Repositories = field(default_factory=Repositories)
    """`[repositories.*]`: the protected paths of each repository an effect writes to."""
    grants: Grants | None = None
    """What this call minted; whoever built the Context closes it (revoking them)."""

    def credential(self, scope: Scope) -> Grant | None:
        return self.grants.credential(scope) if self.grants is not None else None


@runtime_checkable
class EffectHandler(Protocol):
    """The required members; `Handler` documents them and the optional ones."""

    name: str
    reversible: bool
    idempotent: bool
    undo: str

    @property
    def schema(self) -> Mapping[str, Any]: ...

    def preview(self, params: Params, ctx: Context) -> Preview: ...

    def apply(self, params: Params, ctx: Context) -> JSON: ...


@runtime_checkable
class Revertible(Protocol):
    """A handler `broker undo` can use: it reverses what `apply` returned."""

    def revert_preview(self, output: Params, ctx: Context) -> Preview: ...

    def revert(self, output: Params, ctx: Context) -> JSON: ...


REQUIRED_FLAGS = ("reversible", "idempotent")
REQUIRED_METHODS = ("preview", "apply")
OPTIONAL_METHODS = (
    "check_config",
    "canonical",
    "check",
    "reversible_for",
    "protected_for",
    "idempotent_for",
    "returns",
    "revert_preview",
    "revert",
)
OPTIONAL_FLAGS = ("assess_inline", "inline")


class Handler:
    """A base with every optional member's default: declare the flags, implement
    `preview` and `apply`, override what your effect needs."""

    name: ClassVar[str] = ""
    reversible: ClassVar[bool] = False
    idempotent: ClassVar[bool] = False
    undo: ClassVar[str] = "cannot be undone by the broker"
    assess_inline: ClassVar[bool] = False
    inline: ClassVar[bool] = False
    config_keys: ClassVar[frozenset[str]] = frozenset()
    """The keys `check_config` accepts under [integrations.<integration>]."""
    identifying: ClassVar[tuple[str, ...] | None] = None
    """The params a drafted rule names (None: every param)."""

    @property
    def schema(self) -> Mapping[str, Any]:
        module = sys.modules.get(type(self).__module__)
        where = getattr(module, "__file__", None)
        if where:
            own = Path(where).parent / "schemas" / f"{self.name}.json"
            if own.is_file():
                return _read_schema(own)
        return load_schema(self.name)

    def check_config(self, settings: Mapping[str, Any]) -> None:
        reject_unknown_keys(settings, self.config_keys, self.name.split(".", 1)[0])

    def canonical(self, params: Params, ctx: Context) -> Params:
        return params

    def check(self, params: Params, ctx: Context) -> None:
        return None

    def reversible_for(self, params: Params, ctx: Context) -> bool:
        return self.reversible

    def protected_for(self, params: Params, ctx: Context) -> Sequence[str]:
        return ()

    def idempotent_for(self, params: Params, ctx: Context) -> bool:
        return self.idempotent

    def returns(self, settings: Mapping[str, Any]) -> Mapping[str, str]:
        return {}

    def preview(self, params: Params, ctx: Context) -> Preview:
        raise NotImplementedError

    def apply(self, params: Params, ctx: Context) -> JSON:
        raise NotImplementedError


def _read_schema(path: Path) -> dict[str, Any]:
    import json

    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


# -- settings helpers -------------------------------------------------------------


def reject_unknown_keys(settings: Mapping[str, Any], known: frozenset[str], section: str) -> None:
    """Refuse a key `check_config` does not know, naming it (a typo never passes)."""
    only_keys(f"integrations.{section}", settings, known)


def optional_setting(
    settings: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str
) -> Any:
    """`settings[key]` if present and of `kind` (None when absent); else ConfigError."""
    value = settings.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}.{key}: expected {names}, got {value!r}")
    return value
