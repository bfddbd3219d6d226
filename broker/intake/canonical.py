"""Canonical params: the one form of a request that the policy matches, the preview
shows, the approval binds and `apply` receives.

Admission calls `canonical_request` right after the params schema: the handler's
`canonical(params, ctx)` rewrites its params into their one form (or refuses input
with no single meaning), and the rewritten params pass the schema again. What is
recorded, hashed (`request_sha256`) and answered is that canonical request, so a rule
on `path = "bin/*"` cannot be stepped around with `./bin/x`, `bin//x` or `bin/x/.`.

Handlers build their canonical forms with `effects.normal_forms` (relative paths, URL
paths, Unicode that must already be in NFC).
"""

from __future__ import annotations

import dataclasses

from broker.config import Config
from broker.context import context_for
from broker.models import Record, Request
from broker.registry import Registry
from broker.validation import Validator

__all__ = ["canonical_request"]


def canonical_request(
    request: Request, registry: Registry, validator: Validator, config: Config
) -> Request:
    """`request` with its params in the handler's canonical form (schema checked before
    and after); raises the Rejected / InvalidParams that make it `invalid`."""
    validator.params(request.effect, request.params)
    effect = registry.effect(request.effect)
    provisional = Record(
        sandbox=request.sandbox,
        id=request.id,
        name=request.name,
        state="received",
        received_at="",
        effect=request.effect,
        payload=request.payload.decode("utf-8"),
        sha256=request.sha256,
    )
    params = effect.canonical(request.params, context_for(config, provisional))
    if params == request.params:
        return request
    rewritten = dict(params)
    validator.params(request.effect, rewritten)
    return dataclasses.replace(request, params=rewritten)
