"""webhook.post: a JSON payload to a webhook target the host names.

Settings, `[integrations.webhook]`:

    allow_networks = ["10.0.0.0/8"]     # optional, as for http.request
    ca_file = "/etc/ssl/internal.pem"   # optional extra CA to trust

    [integrations.webhook.targets.deploy-notify]
    url_env = "DEPLOY_HOOK_URL"         # or url_file, url_kv, or url when it is no secret
    secret_env = "DEPLOY_HOOK_SECRET"   # optional HMAC-SHA256 key (or secret_file, secret_kv)
    retries = 3                         # after the first attempt; 5xx and network errors only
    backoff = "1s"                      # doubled after each retry
    timeout = "10s"                     # per attempt
    allow_networks = ["10.9.0.0/16"]    # optional, this target only

Every delivery carries `X-Broker-Delivery` (stable for the request, so a receiver can
drop repeats), `X-Broker-Timestamp` (Unix seconds) and, with a secret,
`X-Broker-Signature: sha256=<hex HMAC-SHA256 of the exact body bytes>`. The payload is
passed through as JSON, so Slack incoming webhooks work unchanged.

`url_kv = "PATH#FIELD"` and `secret_kv` read the target's URL and key per delivery from
the provider `[integrations.webhook] credential = "NAME"` names (effects/kv.py): the
key at apply only, a URL also for the preview (which checks its address).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpcore
import httpx

from broker.clock import parse_duration
from broker.errors import ConfigError, EffectFailed, InvalidParams
from broker.masking import Masker
from broker.models import Preview
from broker.typing import JSON, Params
from effects import kv
from effects.base import Context, Handler, Settings
from effects.netguard import (
    HTTPX_ERRORS,
    MASK,
    Allowed,
    DestinationRefused,
    IPNetwork,
    NetGuard,
    Resolver,
    Secret,
    check_ca_file,
    client,
    default_port,
    http_failure,
    parse_allowed,
    parse_networks,
    parse_url,
    read_capped,
    scrub,
    system_resolver,
)

TARGET_KEYS = frozenset(
    {"url", "url_env", "url_file", "secret_env", "secret_file", "retries", "backoff", "timeout"}
    | {"allow_networks", "response", "url_kv", "secret_kv"}
)
MAX_RETRIES = 10
RESPONSE_BYTES = 2048
# transient: worth another attempt; the delivery id lets the receiver drop a repeat
RETRYABLE = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class Target:
    """`[integrations.webhook.targets.NAME]`, checked, secrets resolved."""

    name: str
    url: httpx.URL
    url_is_secret: bool
    key: str | None = None
    retries: int = 3
    backoff: float = 1.0
    timeout: float = 10.0
    allow: tuple[IPNetwork, ...] = ()
    response: Allowed = field(default_factory=Allowed)

    @property
    def shown(self) -> str:
        """The URL as people may see it: a secret URL shows only its origin."""
        if not self.url_is_secret:
            return str(self.url)
        return f"{self.url.scheme}://{self.url.netloc.decode('ascii')}/{MASK}"

    @property
    def secrets(self) -> list[str]:
        """What must never be shown: the key, and a secret URL (whole, and its path)."""
        found = [self.key] if self.key else []
        if self.url_is_secret:
            found.append(str(self.url))
            path = self.url.raw_path.decode("ascii")
            if len(path) >= 8:
                found.append(path)
        return found


@dataclass(frozen=True)
class WebhookSettings:
    """`[integrations.webhook]`, checked, secrets resolved."""

    allow: tuple[IPNetwork, ...]
    ca_file: str | None
    targets: Mapping[str, Target]


def _duration(table: Mapping[str, Any], key: str, default: str, where: str) -> float:
    try:
        return parse_duration(table.get(key, default))
    except ValueError as exc:
        raise ConfigError(f"{where}.{key}: {exc}") from exc


def _target(name: str, spec: Any, secret: Secret) -> Target:
    where = f"integrations.webhook.targets.{name}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", name):
        raise ConfigError(f"{where}: a target name is letters, digits, '-' and '_'")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a table")
    unknown = set(spec) - TARGET_KEYS
    if unknown:
        key = sorted(unknown)[0]
        hint = "; use secret_env or secret_file" if key == "secret" else ""
        raise ConfigError(f"{where}.{key}: unknown key{hint}")
    if sum(k in spec for k in ("url", "url_env", "url_file", "url_kv")) != 1:
        raise ConfigError(f"{where}: set exactly one of url, url_env, url_file and url_kv")
    raw = spec.get("url") or secret(Settings.key("targets", name, "url"))
    if not isinstance(raw, str) or not raw:
        raise ConfigError(f"{where}.url: an http(s) URL is required")
    secret_url = "url" not in spec
    try:
        url = parse_url(raw.strip())
    except InvalidParams as exc:
        message = scrub(exc.issues[0].message, [raw] if secret_url else [])
        raise ConfigError(f"{where}.url: not a usable URL: {message}") from exc
    retries = spec.get("retries", 3)
    if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= MAX_RETRIES:
        raise ConfigError(f"{where}.retries: a whole number from 0 to {MAX_RETRIES}")
    key = secret(Settings.key("targets", name, "secret"))
    if key is not None and not key:
        raise ConfigError(f"{where}.secret: the signing secret is empty")
    return Target(
        name=name,
        url=url,
        url_is_secret=secret_url,
        key=key,
        retries=retries,
        backoff=_duration(spec, "backoff", "1s", where),
        timeout=_duration(spec, "timeout", "10s", where),
        allow=parse_networks(spec.get("allow_networks"), f"{where}.allow_networks"),
        # a secret URL reaches the receiver, which may echo it in any encoding
        response=parse_allowed(spec.get("response"), f"{where}.response", secret_url),
    )


def settings_from(table: Mapping[str, Any], secret: Secret | None = None) -> WebhookSettings:
    """Parse and check `[integrations.webhook]`; a fault names the key. Secrets come
    from `secret` (`ctx.secret`), else resolve in `table` as at start."""
    where = "integrations.webhook"
    secret = secret or kv.static(table, where)
    raw = table.get("targets", {})
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}.targets: expected tables [{where}.targets.NAME]")
    ca_file = check_ca_file(table.get("ca_file"), f"{where}.ca_file")
    return WebhookSettings(
        allow=parse_networks(table.get("allow_networks"), f"{where}.allow_networks"),
        ca_file=ca_file,
        targets={name: _target(name, spec, secret) for name, spec in raw.items()},
    )


def payload_bytes(params: Params) -> bytes:
    """The exact body: the payload as compact UTF-8 JSON."""
    return json.dumps(
        params["payload"], ensure_ascii=False, separators=(",", ":"), allow_nan=False
    ).encode("utf-8")


def delivery_id(ctx: Context) -> str:
    """Stable for one request in one sandbox, so a receiver can recognise a repeat."""
    seed = f"{ctx.sandbox}\n{ctx.request_id}\n{ctx.request_sha256}".encode()
    return hashlib.sha256(seed).hexdigest()


def signature(key: str, body: bytes) -> str:
    """The X-Broker-Signature value: HMAC-SHA256 over the exact body bytes."""
    return "sha256=" + hmac.new(key.encode("utf-8"), body, hashlib.sha256).hexdigest()


class WebhookPost(Handler):
    """POST a JSON payload to a named target: signed, retried, never redirected."""

    name = "webhook.post"
    identifying = ("target",)
    reversible = False
    idempotent = True
    undo = (
        "a delivered webhook cannot be recalled; a repeat carries the same X-Broker-Delivery "
        "id so the receiver can drop it"
    )
    config_keys: ClassVar[frozenset[str]] = frozenset(
        {"allow_networks", "ca_file", "targets", "credential"}
    )

    def __init__(
        self,
        resolver: Resolver | None = None,
        backend: httpcore.NetworkBackend | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.resolver = resolver or system_resolver
        self.backend = backend
        self.sleep = sleep

    def check_config(self, settings: Mapping[str, Any]) -> None:
        super().check_config(settings)
        settings_from(settings)

    def returns(self, settings: Mapping[str, Any]) -> Mapping[str, str]:
        """Per target, what of the receiver's answer comes back."""
        targets = settings_from(settings).targets.values()
        return {f"target {t.name}": t.response.describe() for t in targets}

    def _target(
        self, params: Params, ctx: Context, fetch: tuple[str, ...] = ()
    ) -> tuple[WebhookSettings, Target]:
        """The settings and the named target; of its KV secrets, those named in `fetch`
        (`url`, `secret`) are read, every other one stands for itself (effects/kv.py)."""
        name = str(params.get("target", ""))
        named = '"' not in name and name
        mine = {Settings.key("targets", name, k) for k in fetch} if named else set()
        try:
            secret = kv.reader(ctx, "integrations.webhook", mine.__contains__)
            settings = settings_from(ctx.settings, secret)
        except ConfigError as exc:
            raise EffectFailed(
                f"failed: webhook.post is misconfigured on this host ({exc}); tell the operator"
            ) from exc
        target = settings.targets.get(params["target"])
        if target is None:
            known = ", ".join(sorted(settings.targets)) or "none are configured"
            raise InvalidParams(
                "/params/target",
                f"no webhook target named {params['target']!r} (known: {known})",
                "unknown_target",
            )
        return settings, target

    def check(self, params: Params, ctx: Context) -> None:
        self._target(params, ctx)

    def preview(self, params: Params, ctx: Context) -> Preview:
        settings, target = self._target(params, ctx, ("url",))  # its address is checked
        body = payload_bytes(params)
        guard = NetGuard(settings.allow + target.allow, self.resolver)
        try:
            address = ", ".join(guard.addresses(target.url.host, default_port(target.url)))
        except DestinationRefused as exc:
            address = scrub(exc.reason.removeprefix("failed: "), target.secrets)
        signed = "X-Broker-Signature: sha256=••• (HMAC-SHA256 of the body)" if target.key else ""
        headers = "; ".join(
            h
            for h in (
                "Content-Type: application/json",
                f"X-Broker-Delivery: {delivery_id(ctx)}",
                "X-Broker-Timestamp: (the time of sending)",
                signed,
            )
            if h
        )
        return Preview(
            title=f"POST {len(body)} bytes of JSON to webhook {target.name}",
            target=f"webhook: {target.name} ({target.shown})",
            body=body.decode("utf-8"),
            body_kind="json",
            facts=(
                ("url", target.shown),
                ("address", address),
                ("headers", headers),
                ("signed", "yes" if target.key else "no"),
                ("response", f"{target.response.describe()} returns to the agent"),
                (
                    "retries",
                    f"up to {target.retries} on 5xx answers or network errors, never on 4xx",
                ),
                ("body", f"{len(body)} bytes, sha256 {hashlib.sha256(body).hexdigest()}"),
            ),
        )

    def apply(self, params: Params, ctx: Context) -> JSON:
        settings, target = self._target(params, ctx, ("url", "secret"))
        body = payload_bytes(params)
        delivery = delivery_id(ctx)
        guard = NetGuard(settings.allow + target.allow, self.resolver)
        what = f"webhook target {target.name}"
        try:
            transport = guard.transport(ca_file=settings.ca_file, inner=self.backend)
        except OSError as exc:
            raise http_failure(exc, what, target.secrets) from exc
        last = ""
        with client(transport) as http:
            for attempt in range(1, target.retries + 2):
                if attempt > 1:
                    self.sleep(min(target.backoff * 2 ** (attempt - 2), 60.0))
                outcome = _deliver(http, target, body, delivery, attempt)
                if not isinstance(outcome, str):
                    return outcome
                last = outcome  # worth another attempt
        attempts = target.retries + 1
        raise EffectFailed(
            f"{last} (gave up after {attempts} attempt{'s' if attempts > 1 else ''}); "
            "try again later"
        )


def _deliver(
    http: httpx.Client, target: Target, body: bytes, delivery: str, attempt: int
) -> JSON | str:
    """One attempt: the output when it was delivered, the reason when it is worth
    another attempt (5xx, network); EffectFailed when it is not."""
    what = f"webhook target {target.name}"
    headers = {
        "Content-Type": "application/json",
        "X-Broker-Delivery": delivery,
        "X-Broker-Timestamp": str(int(time.time())),
    }
    if target.key:
        headers["X-Broker-Signature"] = signature(target.key, body)
    request = http.build_request(
        "POST", target.url, headers=headers, content=body, timeout=target.timeout
    )
    try:
        response = http.send(request, stream=True)
        reply = read_capped(response, RESPONSE_BYTES, time.monotonic() + target.timeout)
    except RETRYABLE as exc:
        return http_failure(exc, what, target.secrets).reason
    except (*HTTPX_ERRORS, OSError) as exc:
        raise http_failure(exc, what, target.secrets) from exc
    allowed = target.response
    answer = (
        f"{reply.status} {reply.reason}".strip() if allowed.mode == "body" else str(reply.status)
    )
    text = scrub(reply.text(), target.secrets) if allowed.mode == "body" else ""
    if 200 <= reply.status < 300:
        out: JSON = {
            "target": target.name,
            "status": reply.status,
            "attempts": attempt,
            "delivery_id": delivery,
            "truncated": reply.truncated is not None,
            "returned": allowed.mode,
        }
        if allowed.mode == "body":
            out["response"] = text
        elif allowed.mode == "json":
            out.update(Masker(target.secrets)(allowed.pick(reply.body)))
        return out
    if reply.status >= 500:
        return f"failed: {what} answered {answer}"
    raise EffectFailed(
        f"failed: {what} answered {answer}"
        + (f": {text[:300]}" if text else "")
        + (
            "; webhooks are not redirected: ask the operator to fix the target URL"
            if 300 <= reply.status < 400
            else "; it refused this payload, so it was not retried: fix the payload "
            "and send a new request"
        )
    )
