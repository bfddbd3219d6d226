"""webhook.post against a real HTTP server on 127.0.0.1: the signed body that arrives,
the stable delivery id, retries on 5xx and network errors and none on 4xx, and a
secret URL that never shows."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from broker.errors import ConfigError, EffectFailed, InvalidParams
from effects.webhook import WebhookPost, delivery_id
from tests.effects.netfixtures import (  # noqa: F401  (fixtures, used by their names)
    FakeResolver,
    MakeContext,
    RecordingBackend,
    fixture_loopback_only,
    fixture_make_ctx,
    fixture_recorder,
    fixture_resolver,
    fixture_web,
    fixture_web_server,
    run,
)

KEY = "hmac-signing-key-99"
HOOK_PATH = "/services/T000/B000/XXXXsecretXXXX"


@pytest.fixture
def settings(web: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Targets on the local server: `deploy-notify` (secret URL, signed) and `plain`."""
    monkeypatch.setenv("DEPLOY_HOOK_URL", f"http://127.0.0.1:{web.port}{HOOK_PATH}")
    monkeypatch.setenv("DEPLOY_HOOK_SECRET", KEY)
    return {
        "allow_networks": ["127.0.0.0/8"],
        "targets": {
            "deploy-notify": {
                "url_env": "DEPLOY_HOOK_URL",
                "secret_env": "DEPLOY_HOOK_SECRET",
                "retries": 2,
                "backoff": "10ms",
                "timeout": "2s",
                "response": "body",  # these tests read the receiver's answer
            },
            "plain": {"url": f"http://127.0.0.1:{web.port}/hook", "retries": 0},
        },
    }


class Sleeps:
    """Records the backoff between attempts instead of waiting."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def statuses(*codes: int) -> Any:
    """A handler answering with `codes` in turn (the last one from then on)."""
    answers = list(codes)

    def answer(request: Request) -> Response:
        code = answers.pop(0) if len(answers) > 1 else answers[0]
        return Response("ok" if code < 300 else f"error {code}", status=code)

    return answer


def test_signed_delivery_arrives_with_the_exact_body(
    web: HTTPServer, settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """The receiver gets the exact JSON, a verifying HMAC, a timestamp and the delivery id."""
    web.expect_request(HOOK_PATH, method="POST").respond_with_data("ok")
    ctx = make_ctx(settings)
    payload = {"text": "Deployed *api* 1.2.3 ✅", "blocks": [{"type": "divider"}]}
    out = run(WebhookPost(), {"target": "deploy-notify", "payload": payload}, ctx)
    request, _ = web.log[0]
    body = request.get_data()
    assert body == json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    expected = "sha256=" + hmac.new(KEY.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(request.headers["X-Broker-Signature"], expected)
    assert abs(int(request.headers["X-Broker-Timestamp"]) - time.time()) < 60
    assert request.headers["X-Broker-Delivery"] == delivery_id(ctx) == out["delivery_id"]
    assert request.headers["Content-Type"] == "application/json"
    assert out == {
        "target": "deploy-notify",
        "status": 200,
        "attempts": 1,
        "delivery_id": delivery_id(ctx),
        "response": "ok",
        "truncated": False,
        "returned": "body",
    }


def test_delivery_id_is_stable_per_request_and_differs_between_requests(
    make_ctx: MakeContext,
) -> None:
    """The same request gets the same id again; another request id or sandbox does not."""
    first = delivery_id(make_ctx({}))
    assert delivery_id(make_ctx({})) == first
    assert delivery_id(make_ctx({}, request_id="req-2")) != first
    assert delivery_id(make_ctx({}, sandbox="other")) != first


def test_unsigned_target_sends_no_signature(
    web: HTTPServer, settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """A target without a secret sends the payload unsigned (Slack-style), still with an id."""
    web.expect_request("/hook").respond_with_data("ok")
    run(WebhookPost(), {"target": "plain", "payload": {"text": "hi"}}, make_ctx(settings))
    request, _ = web.log[0]
    assert "X-Broker-Signature" not in request.headers
    assert request.headers["X-Broker-Delivery"]
    assert request.get_json() == {"text": "hi"}


def test_retries_on_503_with_backoff_and_the_same_delivery_id(
    web: HTTPServer, settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """503, 503, then 200: three attempts, doubling backoff, one delivery id throughout."""
    web.expect_request(HOOK_PATH).respond_with_handler(statuses(503, 503, 200))
    sleeps = Sleeps()
    out = run(
        WebhookPost(sleep=sleeps),
        {"target": "deploy-notify", "payload": {"n": 1}},
        make_ctx(settings),
    )
    assert out["status"] == 200 and out["attempts"] == 3
    assert sleeps.seconds == [0.01, 0.02]
    ids = {request.headers["X-Broker-Delivery"] for request, _ in web.log}
    assert len(web.log) == 3 and ids == {out["delivery_id"]}


def test_no_retry_on_400(web: HTTPServer, settings: dict[str, Any], make_ctx: MakeContext) -> None:
    """A 400 is the receiver refusing the payload: one attempt, a reason that says so."""
    web.expect_request(HOOK_PATH).respond_with_data("invalid_payload", status=400)
    sleeps = Sleeps()
    with pytest.raises(EffectFailed) as caught:
        run(
            WebhookPost(sleep=sleeps),
            {"target": "deploy-notify", "payload": {}},
            make_ctx(settings),
        )
    assert len(web.log) == 1 and sleeps.seconds == []
    assert "400 BAD REQUEST: invalid_payload" in caught.value.reason
    assert "not retried" in caught.value.reason


def test_gives_up_after_the_configured_retries(
    web: HTTPServer, settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """Always 503: 1 + retries attempts, then a failure that counts them."""
    web.expect_request(HOOK_PATH).respond_with_data("down", status=503)
    with pytest.raises(EffectFailed, match=r"503 SERVICE UNAVAILABLE.*gave up after 3 attempts"):
        run(
            WebhookPost(sleep=Sleeps()),
            {"target": "deploy-notify", "payload": {}},
            make_ctx(settings),
        )
    assert len(web.log) == 3


def test_connection_errors_are_retried(
    settings: dict[str, Any], recorder: RecordingBackend, make_ctx: MakeContext
) -> None:
    """A target that cannot be reached is tried 1 + retries times, then fails with a reason."""
    with pytest.raises(EffectFailed, match=r"could not connect.*gave up after 3 attempts"):
        run(
            WebhookPost(backend=recorder, sleep=Sleeps()),
            {"target": "deploy-notify", "payload": {}},
            make_ctx(settings),
        )
    assert len(recorder.attempts) == 3


def test_redirects_are_not_followed(
    web: HTTPServer, settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """A 302 from a webhook target fails, and its Location is never fetched."""
    web.expect_request(HOOK_PATH).respond_with_data(
        "", status=302, headers={"Location": "http://169.254.169.254/"}
    )
    with pytest.raises(EffectFailed, match="not redirected"):
        run(WebhookPost(), {"target": "deploy-notify", "payload": {}}, make_ctx(settings))
    assert len(web.log) == 1


def test_secret_url_and_key_never_show(
    web: HTTPServer, settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """The preview, an echoed answer and a failure reason show the URL's origin only."""
    web.expect_request(HOOK_PATH).respond_with_data(f"bad hook {HOOK_PATH} key {KEY}", status=404)
    ctx = make_ctx(settings)
    params = {"target": "deploy-notify", "payload": {"text": "hi"}}
    preview = WebhookPost().preview(params, ctx)
    with pytest.raises(EffectFailed) as caught:
        run(WebhookPost(), params, ctx)
    shown = json.dumps(preview.to_json()) + caught.value.reason
    assert "XXXXsecretXXXX" not in shown and KEY not in shown
    assert f"http://127.0.0.1:{web.port}/•••" in preview.target
    assert preview.body == '{"text":"hi"}'
    assert dict(preview.facts)["signed"] == "yes"


def test_target_at_the_metadata_address_is_refused_without_a_connection(
    recorder: RecordingBackend, make_ctx: MakeContext
) -> None:
    """The address guard applies to webhook targets too: nothing is attempted or retried."""
    settings = {"targets": {"meta": {"url": "http://169.254.169.254/hook"}}}
    with pytest.raises(EffectFailed, match="link-local"):
        run(
            WebhookPost(backend=recorder, sleep=Sleeps()),
            {"target": "meta", "payload": {}},
            make_ctx(settings),
        )
    assert recorder.attempts == []


def test_target_name_resolving_to_loopback_is_refused(
    resolver: FakeResolver, recorder: RecordingBackend, make_ctx: MakeContext
) -> None:
    """Without allow_networks, a target whose name resolves to 127.0.0.1 is refused."""
    settings = {"targets": {"t": {"url": "https://internal.test/hook"}}}
    with pytest.raises(EffectFailed, match=r"internal\.test.*loopback"):
        run(
            WebhookPost(resolver=resolver, backend=recorder),
            {"target": "t", "payload": {}},
            make_ctx(settings),
        )
    assert recorder.attempts == []


def test_unknown_target_is_invalid_and_names_the_known_ones(
    settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """A target the host does not define is invalid, listing the defined ones."""
    with pytest.raises(InvalidParams, match="known: deploy-notify, plain"):
        WebhookPost().check({"target": "ops", "payload": {}}, make_ctx(settings))


def test_flags_say_repeatable_but_not_reversible() -> None:
    """Not reversible (approval by default); idempotent thanks to the delivery id."""
    handler = WebhookPost()
    assert handler.reversible is False and handler.idempotent is True
    assert "X-Broker-Delivery" in handler.undo


@pytest.mark.parametrize(
    ("target", "key"),
    [
        ({"url": "https://h.test/x", "secret": "literal"}, "integrations.webhook.targets.t.secret"),
        ({"url_env": "NO_SUCH_VAR_42"}, "integrations.webhook.targets.t.url_env"),
        ({}, "integrations.webhook.targets.t"),
        ({"url": "ftp://h.test/x"}, "integrations.webhook.targets.t.url"),
        ({"url": "https://h.test/x", "retries": 99}, "integrations.webhook.targets.t.retries"),
        ({"url": "https://h.test/x", "backoff": "later"}, "integrations.webhook.targets.t.backoff"),
    ],
)
def test_broken_configuration_stops_the_start_naming_the_key(
    target: dict[str, Any], key: str
) -> None:
    """check_config refuses literal secrets, missing URLs, bad schemes and bad numbers."""
    with pytest.raises(ConfigError) as caught:
        WebhookPost().check_config({"targets": {"t": target}})
    assert str(caught.value).startswith(key)
