"""http.request against a real HTTP(S) server on 127.0.0.1 (allowed explicitly with
allow_networks): what arrives, what the agent gets back, what a person is shown, and
the whole path through a running broker."""

from __future__ import annotations

import base64
import hashlib
import json
import time
import tomllib
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from broker.errors import ConfigError, EffectFailed, InvalidParams
from broker.policy.ruleset import parse_policy
from broker.testing import BrokerHarness
from effects.http import HttpRequest
from tests.effects.netfixtures import (  # noqa: F401  (fixtures, used by their names)
    FakeResolver,
    MakeContext,
    RecordingBackend,
    fixture_ca,
    fixture_ca_file,
    fixture_loopback_only,
    fixture_make_ctx,
    fixture_recorder,
    fixture_resolver,
    fixture_tls_web,
    fixture_tls_web_server,
    fixture_web,
    fixture_web_server,
    run,
)

TOKEN = "crm-s3cr3t-token-42"
LOOPBACK = ["127.0.0.0/8"]


def base(server: HTTPServer) -> str:
    return f"http://127.0.0.1:{server.port}"


@pytest.fixture
def crm_token(monkeypatch: pytest.MonkeyPatch) -> str:
    """The CRM token, in the host's environment only."""
    monkeypatch.setenv("CRM_TOKEN", TOKEN)
    return TOKEN


@pytest.fixture
def settings(web: HTTPServer, crm_token: str) -> dict[str, Any]:
    """[integrations.http] with loopback allowed and a `crm` destination on the server."""
    return {
        "allow_networks": LOOPBACK,
        "max_response_bytes": 1000,
        "max_response_time": "2s",
        "destinations": {
            "crm": {
                "base_url": f"{base(web)}/api",
                "headers": {"Accept": "application/json"},
                "secret_headers": {
                    "Authorization": {"value_env": "CRM_TOKEN", "prefix": "Bearer "}
                },
                "response": "body",  # these tests read what the service echoed
            }
        },
    }


def echo(request: Request) -> Response:
    """Answer with what came in, including every header (so a leak would show)."""
    seen = {
        "method": request.method,
        "path": request.path,
        "query": request.args.to_dict(flat=False),
        "headers": dict(request.headers),
        "body": request.get_data(as_text=True),
    }
    return Response(
        json.dumps(seen),
        content_type="application/json",
        headers={"X-Echo-Auth": request.headers.get("Authorization", "")},
    )


def test_get_with_query_and_headers_reaches_the_server(
    web: HTTPServer, make_ctx: MakeContext
) -> None:
    """Method, path, query and the agent's headers arrive; the answer comes back as text."""
    web.expect_request("/items", method="GET", query_string="q=a+b&page=2").respond_with_json(
        {"items": [1, 2]}
    )
    out = run(
        HttpRequest(),
        {
            "method": "GET",
            "url": f"{base(web)}/items",
            "query": {"q": "a b", "page": 2},
            "headers": {"X-Trace": "t-1"},
        },
        make_ctx({"allow_networks": LOOPBACK}),
    )
    assert out["status"] == 200 and out["status_text"] == "OK"
    assert json.loads(out["body"]) == {"items": [1, 2]}
    assert out["encoding"] == "text" and out["truncated"] is False
    request, _ = web.log[0]
    assert request.headers["X-Trace"] == "t-1"
    assert request.headers["Host"] == f"127.0.0.1:{web.port}"


def test_post_sends_the_exact_json_bytes(web: HTTPServer, make_ctx: MakeContext) -> None:
    """A JSON body goes out compact, UTF-8, as application/json; a 201 is reported."""
    web.expect_request("/things", method="POST").respond_with_data("made", status=201)
    out = run(
        HttpRequest(),
        {"method": "POST", "url": f"{base(web)}/things", "json": {"name": "Zoë", "n": 1}},
        make_ctx({"allow_networks": LOOPBACK}),
    )
    request, _ = web.log[0]
    assert request.get_data() == '{"name":"Zoë","n":1}'.encode()
    assert request.headers["Content-Type"] == "application/json"
    assert out["status"] == 201 and out["body"] == "made"


def test_destination_injects_the_credential_the_agent_never_sees(
    web: HTTPServer, settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """The server gets the Bearer token; echoed back, it reads ••• in body and headers."""
    web.expect_request("/api/v2/contacts").respond_with_handler(echo)
    out = run(
        HttpRequest(),
        {"method": "GET", "destination": "crm", "path": "/v2/contacts"},
        make_ctx(settings),
    )
    request, _ = web.log[0]
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["Accept"] == "application/json"
    assert TOKEN not in json.dumps(out)
    assert json.loads(out["body"])["headers"]["Authorization"] == "•••"
    assert out["headers"]["x-echo-auth"] == "•••"


def test_agent_cannot_override_an_injected_header(
    settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """Setting Authorization on a destination request is invalid, with a reason."""
    params = {
        "method": "GET",
        "destination": "crm",
        "path": "/x",
        "headers": {"authorization": "Bearer mine"},
    }
    with pytest.raises(InvalidParams, match="set by the host for destination crm"):
        HttpRequest().check(params, make_ctx(settings))


@pytest.mark.parametrize(
    "path", ["/../admin", "/a/%2e%2e/admin", "/a%2f..%2fadmin", "/x?y=1", "/x#f", "/a b"]
)
def test_destination_paths_stay_below_the_base_url(
    path: str, settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """'..', encoded '..', query, fragment and spaces in a path are invalid."""
    with pytest.raises(InvalidParams) as caught:
        HttpRequest().check(
            {"method": "GET", "destination": "crm", "path": path}, make_ctx(settings)
        )
    assert caught.value.issues[0].path == "/params/path"


def test_unknown_destination_lists_the_known_ones(
    settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """A destination the host does not define is invalid, and the reason names crm."""
    with pytest.raises(InvalidParams, match="known: crm"):
        HttpRequest().check(
            {"method": "GET", "destination": "billing", "path": "/"}, make_ctx(settings)
        )


def test_redirects_are_not_followed_by_default(web: HTTPServer, make_ctx: MakeContext) -> None:
    """A 302 comes back as the answer, with its Location, and nothing else is fetched."""
    web.expect_request("/old").respond_with_data(
        "", status=302, headers={"Location": "http://169.254.169.254/latest/meta-data/"}
    )
    out = run(
        HttpRequest(),
        {"method": "GET", "url": f"{base(web)}/old"},
        make_ctx({"allow_networks": LOOPBACK}),
    )
    assert out["status"] == 302 and out["redirects"] == []
    assert out["headers"]["location"] == "http://169.254.169.254/latest/meta-data/"
    assert len(web.log) == 1


def test_followed_redirect_to_the_metadata_address_is_refused(
    web: HTTPServer, make_ctx: MakeContext
) -> None:
    """With follow_redirects, a hop to 169.254.169.254 is refused before any connection."""
    web.expect_request("/hop").respond_with_data(
        "", status=302, headers={"Location": "http://169.254.169.254/latest/meta-data/"}
    )
    backend = RecordingBackend(loopback=True)
    with pytest.raises(EffectFailed, match="link-local") as caught:
        run(
            HttpRequest(backend=backend),
            {"method": "GET", "url": f"{base(web)}/hop", "follow_redirects": True},
            make_ctx({"allow_networks": LOOPBACK}),
        )
    assert "169.254.169.254" in caught.value.reason
    assert backend.attempts == [("127.0.0.1", web.port)]


def test_followed_redirect_to_a_numeric_spelling_is_refused(
    web: HTTPServer, make_ctx: MakeContext
) -> None:
    """A Location of http://2130706433/ is refused as a redirect, naming what it means."""
    web.expect_request("/hop").respond_with_data(
        "", status=301, headers={"Location": "http://2130706433/"}
    )
    with pytest.raises(EffectFailed, match=r"redirect .*read as 127\.0\.0\.1"):
        run(
            HttpRequest(),
            {"method": "GET", "url": f"{base(web)}/hop", "follow_redirects": True},
            make_ctx({"allow_networks": LOOPBACK}),
        )


def test_credentials_do_not_follow_a_redirect_to_another_origin(
    web: HTTPServer, settings: dict[str, Any], resolver: FakeResolver, make_ctx: MakeContext
) -> None:
    """A destination's secret header goes to its own origin only, never along a redirect."""
    web.expect_request("/api/start").respond_with_data(
        "", status=307, headers={"Location": f"http://other.test:{web.port}/landing"}
    )
    web.expect_request("/landing").respond_with_handler(echo)
    out = run(
        HttpRequest(resolver=resolver),
        {"method": "GET", "destination": "crm", "path": "/start", "follow_redirects": True},
        make_ctx(settings),
    )
    assert out["status"] == 200
    assert out["redirects"] == [f"http://other.test:{web.port}/landing"]
    (first, _), (second, _) = web.log
    assert first.headers["Authorization"] == f"Bearer {TOKEN}"
    assert "Authorization" not in second.headers
    assert second.headers["Accept"] == "*/*"  # the destination's own headers stayed behind
    assert second.headers["Host"] == f"other.test:{web.port}"


def test_303_after_post_becomes_a_get_without_the_body(
    web: HTTPServer, make_ctx: MakeContext
) -> None:
    """POST → 303 → GET drops the body, as browsers and RFC 9110 do."""
    web.expect_request("/form", method="POST").respond_with_data(
        "", status=303, headers={"Location": "/done"}
    )
    web.expect_request("/done", method="GET").respond_with_handler(echo)
    out = run(
        HttpRequest(),
        {"method": "POST", "url": f"{base(web)}/form", "body": "a=1", "follow_redirects": True},
        make_ctx({"allow_networks": LOOPBACK}),
    )
    seen = json.loads(out["body"])
    assert seen["method"] == "GET" and seen["body"] == ""
    assert "Content-Type" not in seen["headers"]


def test_too_many_redirects_fail(web: HTTPServer, make_ctx: MakeContext) -> None:
    """A redirect loop stops at max_redirects with a reason."""
    web.expect_request("/loop").respond_with_data("", status=302, headers={"Location": "/loop"})
    with pytest.raises(EffectFailed, match="more than 2 redirects"):
        run(
            HttpRequest(),
            {"method": "GET", "url": f"{base(web)}/loop", "follow_redirects": True},
            make_ctx({"allow_networks": LOOPBACK, "max_redirects": 2}),
        )
    assert len(web.log) == 3


def test_large_body_is_truncated_with_a_flag(
    web: HTTPServer, settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """A 5000-byte answer comes back as its first 1000 bytes, flagged truncated by size."""
    web.expect_request("/big").respond_with_data("x" * 5000, content_type="text/plain")
    out = run(HttpRequest(), {"method": "GET", "url": f"{base(web)}/big"}, make_ctx(settings))
    assert out["body"] == "x" * 1000 and out["bytes"] == 1000
    assert out["truncated"] is True and out["truncated_by"] == "size"


def test_slow_body_is_cut_at_the_time_cap(
    web: HTTPServer, settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """A body that trickles for longer than max_response_time comes back cut, flagged 'time'."""

    def trickle() -> Iterator[bytes]:
        for _ in range(40):
            yield b"."
            time.sleep(0.1)

    web.expect_request("/slow").respond_with_response(
        Response(trickle(), content_type="text/plain", direct_passthrough=True)
    )
    settings["max_response_time"] = "0.5s"
    started = time.monotonic()
    out = run(HttpRequest(), {"method": "GET", "url": f"{base(web)}/slow"}, make_ctx(settings))
    assert time.monotonic() - started < 2.0
    assert out["truncated"] is True and out["truncated_by"] == "time"
    assert 0 < len(out["body"]) < 40


def test_binary_body_comes_back_as_base64(web: HTTPServer, make_ctx: MakeContext) -> None:
    """Bytes that are not text are returned base64-encoded, and say so."""
    web.expect_request("/img").respond_with_data(b"\x89PNG\xff\x00", content_type="image/png")
    out = run(
        HttpRequest(),
        {"method": "GET", "url": f"{base(web)}/img"},
        make_ctx({"allow_networks": LOOPBACK}),
    )
    assert out["encoding"] == "base64"
    assert base64.b64decode(out["body"]) == b"\x89PNG\xff\x00"


def test_https_connects_to_the_pinned_address_with_the_name_for_sni_and_host(
    tls_web: HTTPServer, resolver: FakeResolver, ca_file: str, make_ctx: MakeContext
) -> None:
    """api.test is resolved once to 127.0.0.1; TLS verifies api.test and Host says api.test."""
    tls_web.expect_request("/hello").respond_with_data("hi")
    out = run(
        HttpRequest(resolver=resolver),
        {"method": "GET", "url": f"https://api.test:{tls_web.port}/hello"},
        make_ctx({"allow_networks": LOOPBACK, "ca_file": ca_file}),
    )
    assert out["status"] == 200 and out["body"] == "hi"
    request, _ = tls_web.log[0]
    assert request.headers["Host"] == f"api.test:{tls_web.port}"
    assert resolver.calls == ["api.test"]


def test_untrusted_certificate_fails_with_a_reason(
    tls_web: HTTPServer, resolver: FakeResolver, make_ctx: MakeContext
) -> None:
    """Without the CA, the server's certificate is refused and the reason says so."""
    with pytest.raises(EffectFailed, match="CERTIFICATE_VERIFY_FAILED"):
        run(
            HttpRequest(resolver=resolver),
            {"method": "GET", "url": f"https://api.test:{tls_web.port}/hello"},
            make_ctx({"allow_networks": LOOPBACK}),
        )
    assert tls_web.log == []


def test_closed_port_fails_with_could_not_connect(make_ctx: MakeContext) -> None:
    """Nothing listening: the result is a failure the agent can read, not a stack trace."""
    with pytest.raises(EffectFailed, match=r"could not connect to 127\.0\.0\.1"):
        run(
            HttpRequest(),
            {"method": "GET", "url": "http://127.0.0.1:9/"},
            make_ctx({"allow_networks": LOOPBACK}),
        )


def test_preview_shows_the_request_with_secrets_masked(
    settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """Method, full URL, address, headers (token as •••) and the exact body, before sending."""
    params = {
        "method": "POST",
        "destination": "crm",
        "path": "/v2/contacts",
        "query": {"dry": "no"},
        "json": {"email": "a@example.com"},
    }
    preview = HttpRequest().preview(params, make_ctx(settings))
    url = f"{settings['destinations']['crm']['base_url']}/v2/contacts?dry=no"
    facts = dict(preview.facts)
    assert preview.title == f"POST {url}"
    assert facts["url"] == url and facts["address"] == "127.0.0.1"
    assert "Authorization" in facts["destination"]
    assert "POST /api/v2/contacts?dry=no HTTP/1.1" in preview.body
    assert "Authorization: •••" in preview.body
    assert preview.body.endswith('\n\n{"email":"a@example.com"}')
    body = json.dumps(preview.to_json())
    assert TOKEN not in body
    assert hashlib.sha256(b'{"email":"a@example.com"}').hexdigest() in facts["body"]


def test_preview_names_a_refused_address(
    resolver: FakeResolver, recorder: RecordingBackend, make_ctx: MakeContext
) -> None:
    """A person looking at a request to a metadata name sees why it would be refused."""
    preview = HttpRequest(resolver=resolver, backend=recorder).preview(
        {"method": "GET", "url": "http://metadata.test/"}, make_ctx({})
    )
    assert "link-local" in dict(preview.facts)["address"]
    assert recorder.attempts == []


def test_flags_and_per_request_reversibility(make_ctx: MakeContext) -> None:
    """The class is honest (not reversible, not idempotent); a GET or HEAD to a named
    destination is reversible; one to a raw URL (which could carry data out) and a POST
    are not."""
    handler = HttpRequest()
    ctx = make_ctx({})
    assert handler.reversible is False and handler.idempotent is False
    assert "cannot take back" in handler.undo
    named = {"destination": "crm", "path": "/x"}
    assert handler.reversible_for({"method": "GET", **named}, ctx) is True
    assert handler.reversible_for({"method": "HEAD", **named}, ctx) is True
    assert handler.reversible_for({"method": "GET", "url": "https://x.test/"}, ctx) is False
    assert handler.reversible_for({"method": "POST", **named}, ctx) is False


def crm(**spec: Any) -> dict[str, Any]:
    """[integrations.http] with one destination, crm, with `spec` on top of a base_url."""
    return {"destinations": {"crm": {"base_url": "https://c.test", **spec}}}


CRM = "integrations.http.destinations.crm"


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        (crm(headers={"Authorization": "x"}), f"{CRM}.headers.Authorization"),
        (crm(headers={"X-Api-Key": "x"}), f"{CRM}.headers.X-Api-Key"),
        (
            crm(secret_headers={"X-Key": {"value_env": "NO_SUCH_VAR_42"}}),
            f"{CRM}.secret_headers.X-Key.value_env",
        ),
        (crm(secret_headers={"X-Key": "literal"}), f"{CRM}.secret_headers.X-Key"),
        (crm(base_url="ftp://c.test"), f"{CRM}.base_url"),
        (crm(base_url="https://u:p@c.test"), f"{CRM}.base_url"),
        (crm(url="https://c.test"), f"{CRM}.url"),
        ({"allow_networks": ["0.0.0.0/0"]}, "integrations.http.allow_networks"),
        ({"max_response_time": "soon"}, "integrations.http.max_response_time"),
        ({"proxy": "http://p"}, "integrations.http.proxy"),
    ],
)
def test_broken_configuration_stops_the_start_naming_the_key(
    settings: dict[str, Any], key: str
) -> None:
    """check_config refuses literal credentials, missing secrets, bad URLs and unknown keys."""
    with pytest.raises(ConfigError) as caught:
        HttpRequest().check_config(settings)
    assert str(caught.value).startswith(key)


def test_entry_point_registers_the_handlers() -> None:
    """The broker.effects entry points name the three network handlers (each entry point
    named for its effect, so it loads only when that effect is first asked for)."""
    found = {ep.name: ep.value for ep in entry_points(group="broker.effects")}
    assert found["http.request"] == "effects.http:HttpRequest"
    assert found["webhook.post"] == "effects.webhook:WebhookPost"
    assert found["email.send"] == "effects.email:EmailSend"


POLICY = """
[[rules]]
effect = "http.request"
when = { method = ["GET", "HEAD"], destination = "crm" }
action = "auto"
reason = "reading the CRM changes nothing"

[[rules]]
effect = "http.request"
action = "approve"
reason = "anything else waits for a person"
"""


def test_broker_applies_an_allowlisted_get_and_holds_a_post(
    tmp_path: Path, web: HTTPServer, settings: dict[str, Any]
) -> None:
    """Through a broker: a crm GET is applied (status, truncated, no token); a POST waits."""
    web.expect_request("/api/v2/contacts").respond_with_handler(echo)
    with BrokerHarness(
        tmp_path / "h",
        handlers=[HttpRequest()],
        builtins=False,
        integrations={"http": settings},
        policy=POLICY,
    ) as h:
        get = h.submit(
            h.request(
                "http.request", {"method": "GET", "destination": "crm", "path": "/v2/contacts"}
            )
        )
        post = h.submit(
            h.request(
                "http.request",
                {"method": "POST", "destination": "crm", "path": "/v2/contacts", "json": {}},
            ),
            terminal=False,
        )
    assert get["status"] == "applied", get
    assert get["output"]["status"] == 200 and get["output"]["truncated"] is False
    assert TOKEN not in json.dumps(get)
    assert post["status"] == "pending"
    assert len(web.log) == 1


def test_policy_examples_in_the_docs_decide_as_they_say() -> None:
    """The rules in docs/effects-network.md load, and gate by method, destination and host."""
    text = (Path(__file__).parents[2] / "docs" / "effects-network.md").read_text()
    block = text.split("## Policy rules", 1)[1].split("```toml", 1)[1].split("```", 1)[0]
    policy = parse_policy(tomllib.loads(block), {"http.request": False}, "docs")

    def action(**params: Any) -> str:
        safe = params["method"] in ("GET", "HEAD")
        return policy.classify("http.request", params, safe).action

    assert action(method="GET", destination="crm", path="/v2/contacts") == "auto"
    assert action(method="POST", destination="crm", path="/v2/contacts") == "approve"
    assert action(method="GET", url="https://api.github.com/repos/a/b") == "auto"
    assert action(method="GET", url="https://api.github.com.evil.test/x") == "approve"
    assert action(method="GET", url="https://example.com/?leak=1") == "approve"
    assert policy.classify("email.send", {}, False).action == "approve"


@pytest.mark.parametrize(
    ("params", "complaint"),
    [
        ({"method": "GET", "url": "https://x.test/", "path": "/a"}, "either url, or destination"),
        ({"method": "GET", "destination": "crm"}, "either url, or destination"),
        ({"method": "GET", "path": "/a"}, "either url, or destination"),
        ({"method": "PUT", "url": "https://x.test/", "json": {}, "body": "x"}, "json or body"),
    ],
)
def test_ambiguous_requests_are_invalid_with_a_plain_reason(
    params: dict[str, Any], complaint: str, settings: dict[str, Any], make_ctx: MakeContext
) -> None:
    """URL with destination, or json with body, gets a sentence rather than a schema dump."""
    Draft202012Validator(HttpRequest().schema).validate(params)
    with pytest.raises(InvalidParams, match=complaint):
        HttpRequest().check(params, make_ctx(settings))
