"""A third-party effect plugin for the reliability suites, loaded through the real
`broker.effects` entry point: each effect POSTs to a receiver on 127.0.0.1.

    [integrations.crashtest]
    url = "http://127.0.0.1:PORT/"

Every POST carries `X-Delivery-Id: <sandbox>/<request id>` so the receiver can count
deliveries of one request. `crashtest.post` is idempotent: it also sends that id as
`Idempotency-Key`, and the receiver applies a key once. `crashtest.send` is not: every
POST the receiver gets is one more effect in the world (an email sent twice).
`crashtest.noop` touches nothing (floods measure the broker, not the receiver).
`crashtest.slow` is a reversible effect whose service answers slowly: with `gate` =
"assess" its reversibility check, and its preview always, block until the test
creates `<state_dir>/release` (a hung service, until released).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from broker.errors import ConfigError, EffectFailed
from broker.models import Preview

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"value": {"type": "string", "maxLength": 200}, "gate": {"type": "string"}},
    "additionalProperties": False,
}


class _Base:
    name = ""
    reversible = False
    idempotent = False
    undo = "cannot be undone: the receiver keeps what it got"
    schema: Mapping[str, Any] = SCHEMA

    def check_config(self, settings: Mapping[str, Any]) -> None:
        unknown = set(settings) - {"url"}
        if unknown:
            raise ConfigError(f"integrations.crashtest.{sorted(unknown)[0]}: unknown key")
        url = settings.get("url")
        if url is not None and not str(url).startswith("http://127.0.0.1:"):
            raise ConfigError("integrations.crashtest.url: must be http://127.0.0.1:PORT/")

    def check(self, params: Mapping[str, Any], ctx: Any) -> None:
        return None

    def reversible_for(self, params: Mapping[str, Any], ctx: Any) -> bool:
        return self.reversible

    def preview(self, params: Mapping[str, Any], ctx: Any) -> Preview:
        return Preview(
            title=f"{self.name} {params.get('value')!r}",
            target=str(ctx.settings.get("url", "(no url)")),
            body=json.dumps(dict(params), ensure_ascii=False),
            body_kind="json",
        )

    def apply(self, params: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
        delivery = f"{ctx.sandbox}/{ctx.request_id}"
        headers = {"Content-Type": "application/json", "X-Delivery-Id": delivery}
        headers["X-Effect"] = self.name
        if self.idempotent:
            headers["Idempotency-Key"] = delivery
        body = json.dumps({"params": dict(params)}).encode()
        req = urllib.request.Request(str(ctx.settings["url"]), body, headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                answer = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise EffectFailed(f"failed: the receiver did not take it ({exc})") from exc
        return {"delivery": delivery, "deliveries": answer["deliveries"]}


class Post(_Base):
    """An idempotent POST (the receiver honours Idempotency-Key)."""

    name = "crashtest.post"
    reversible = True
    idempotent = True


class Send(_Base):
    """A non-idempotent, irreversible POST: a second delivery is a second effect."""

    name = "crashtest.send"


class Noop(_Base):
    """Touches nothing; answers at once."""

    name = "crashtest.noop"
    reversible = True
    idempotent = True

    def apply(self, params: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
        return {"value": params.get("value")}


class Slow(Noop):
    """A reversible effect whose service is slow to say what it would do."""

    name = "crashtest.slow"

    @staticmethod
    def _wait(ctx: Any) -> None:
        release = ctx.state_dir / "release"
        end = time.monotonic() + 120
        while not release.exists() and time.monotonic() < end:
            time.sleep(0.01)

    def reversible_for(self, params: Mapping[str, Any], ctx: Any) -> bool:
        if params.get("gate") == "assess":
            self._wait(ctx)
        return True

    def preview(self, params: Mapping[str, Any], ctx: Any) -> Preview:
        self._wait(ctx)
        return super().preview(params, ctx)


HANDLERS = [Post, Send, Noop, Slow]
