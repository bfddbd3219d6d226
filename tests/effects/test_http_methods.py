"""A destination's `methods`: a GET-only destination can never be used to send data out.
Against a real HTTP server on 127.0.0.1 (whose log counts what arrived), through a
running broker whose policy would apply anything, through `broker policy explain` and
`broker serve`, and along redirects."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from broker.errors import ConfigError, EffectFailed, InvalidParams
from broker.testing import BrokerHarness
from effects.http import METHODS, HttpRequest, settings_from
from tests.effects.netfixtures import (  # noqa: F401  (fixtures, used by their names)
    FakeResolver,
    MakeContext,
    fixture_loopback_only,
    fixture_make_ctx,
    fixture_resolver,
    fixture_web,
    fixture_web_server,
    run,
)
from tests.support import assert_one_line_error, checked
from tests.support import run_broker as run_cli

LOOPBACK = ["127.0.0.0/8"]
REFUSAL = "destination crm allows GET, HEAD; {} is not allowed: use one of them or ask for another"
ANYTHING_GOES = '[[rules]]\neffect = "http.request"\naction = "auto"\nreason = "trust all"\n'


def base(server: HTTPServer, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{server.port}"


def http(web: HTTPServer, **destinations: dict[str, Any]) -> dict[str, Any]:
    """[integrations.http] with loopback allowed and `destinations` on the server."""
    return {"allow_networks": LOOPBACK, "destinations": destinations}


def read_only(web: HTTPServer) -> dict[str, Any]:
    """crm, GET and HEAD only, written in mixed case as a person might."""
    return http(web, crm={"base_url": f"{base(web)}/api", "methods": ["get", "Head"]})


def test_methods_are_stored_upper_case_in_order_and_absent_means_any(web: HTTPServer) -> None:
    """["head", "get", "GET"] is GET, HEAD; without the key every method is allowed."""
    spec = {"base_url": base(web), "methods": ["head", "get", "GET"]}
    crm = settings_from(http(web, crm=spec, open={"base_url": base(web)})).destinations
    assert crm["crm"].methods == ("GET", "HEAD")
    assert crm["open"].methods is None
    assert all(crm["open"].allows(m) for m in METHODS)


def test_the_method_list_is_the_schemas() -> None:
    """The methods a destination may list are exactly those the params schema accepts."""
    assert tuple(HttpRequest().schema["properties"]["method"]["enum"]) == METHODS


@pytest.mark.parametrize(
    ("methods", "complaint"),
    [
        ([], "a non-empty list"),
        ("GET", "a non-empty list"),
        (["GET", "FETCH"], "'FETCH' is not a method"),
        (["TRACE"], "'TRACE' is not a method"),
        (["GET", 1], "1 is not a method"),
    ],
)
def test_bad_methods_stop_the_start_naming_the_key(methods: Any, complaint: str) -> None:
    """An empty list, a string, an unknown or odd method: ConfigError naming the key."""
    settings = {"destinations": {"crm": {"base_url": "https://c.test", "methods": methods}}}
    with pytest.raises(ConfigError) as caught:
        HttpRequest().check_config(settings)
    message = str(caught.value)
    assert message.startswith("integrations.http.destinations.crm.methods: ")
    assert complaint in message and "GET, HEAD, OPTIONS, POST, PUT, PATCH, DELETE" in message


def write_config(tmp_path: Path, methods: str) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(
        f'[broker]\nstate_dir = "{tmp_path / "state"}"\n'
        f'policy = "{tmp_path / "policy.toml"}"\n\n'
        '[integrations.http]\nallow_networks = ["127.0.0.0/8"]\n'
        "[integrations.http.destinations.crm]\n"
        f'base_url = "http://127.0.0.1:9/api"\nmethods = {methods}\n'
    )
    (tmp_path / "policy.toml").write_text(ANYTHING_GOES)
    return path


def write_request(tmp_path: Path, params: dict[str, Any]) -> Path:
    path = tmp_path / "request.json"
    doc = {"version": 1, "id": "r1", "effect": "http.request", "params": params}
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("command", ["explain", "serve"])
def test_a_bad_method_in_broker_toml_is_one_line_from_the_cli(
    home: Path, tmp_path: Path, command: str
) -> None:
    """`broker policy explain` and `broker serve` stop with one line naming the key."""
    config = write_config(tmp_path, '["GET", "FETCH"]')
    request = write_request(tmp_path, {"method": "GET", "destination": "crm", "path": "/x"})
    args = ["policy", "explain", str(request)] if command == "explain" else ["serve"]
    proc = run_cli(*args, "--config", str(config), home=home)
    assert_one_line_error(proc, "integrations.http.destinations.crm.methods", "FETCH")


def test_explain_shows_the_refusal_before_any_rule(home: Path, tmp_path: Path) -> None:
    """A POST to a GET-only destination is `invalid` before the (allow-all) policy; a GET
    to it goes on to the rules."""
    config = write_config(tmp_path, '["get", "head"]')
    post = {"method": "POST", "destination": "crm", "path": "/x", "json": {"a": 1}}
    proc = run_cli("policy", "explain", str(write_request(tmp_path, post)), "--config",
                   str(config), home=home)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert REFUSAL.format("POST") in proc.stdout
    assert "before any rule is consulted" in proc.stdout
    get = {"method": "GET", "destination": "crm", "path": "/x"}
    proc = run_cli("policy", "explain", str(write_request(tmp_path, get)), "--config",
                   str(config), "--json", home=home)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"]["action"] == "auto"


BODIES: list[dict[str, Any]] = [{"json": {"leak": "the agent's findings"}}, {"body": "x=1"}, {}]


def test_a_get_only_destination_serves_gets_and_nothing_else_arrives(
    tmp_path: Path, web: HTTPServer
) -> None:
    """Policy: apply anything. GET and HEAD are applied; POST, PUT, PATCH and DELETE, with
    a JSON body, a text body or none, are `invalid` at /params/method with a reason the
    agent can act on, and the server receives only the GET and the HEAD."""
    web.expect_request("/api/contacts").respond_with_data("ok")
    with BrokerHarness(
        tmp_path / "h", builtins=False, handlers=[HttpRequest()],
        integrations={"http": read_only(web)}, policy=ANYTHING_GOES,
    ) as h:  # fmt: skip
        results = {
            (method, json.dumps(body)): checked(
                h.submit(
                    h.request(
                        "http.request",
                        {"method": method, "destination": "crm", "path": "/contacts", **body},
                    )
                )
            )
            for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
            for body in (BODIES if method not in ("GET", "HEAD") else [{}])
        }
    for (method, _), result in results.items():
        if method in ("GET", "HEAD"):
            assert result["status"] == "applied", result
            assert result["output"]["status"] == 200
        else:
            assert result["status"] == "invalid", result
            assert REFUSAL.format(method) in result["reason"]
            assert {"path": "/params/method", "code": "method_not_allowed"}.items() <= result[
                "errors"
            ][0].items()
    assert len(results) == 14
    assert sorted(r.method for r, _ in web.log) == ["GET", "HEAD"]


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_preview_and_apply_refuse_it_too(
    web: HTTPServer, make_ctx: MakeContext, method: str
) -> None:
    """Defence in depth: preview and apply each check again; nothing reaches the server."""
    params = {"method": method, "destination": "crm", "path": "/x", "body": "data"}
    ctx = make_ctx(read_only(web))
    for step in (HttpRequest().preview, HttpRequest().apply):
        with pytest.raises(InvalidParams, match=REFUSAL.format(method)) as caught:
            step(params, ctx)
        assert caught.value.issues[0].path == "/params/method"
    assert web.log == []


def test_a_raw_url_at_the_destinations_origin_keeps_to_its_methods(
    web: HTTPServer, resolver: FakeResolver, make_ctx: MakeContext
) -> None:
    """A URL at crm's origin (scheme, host, port) is held to GET, HEAD though it carries
    no credentials; the same server under another name is another origin."""
    ctx = make_ctx(read_only(web))
    web.expect_request("/elsewhere").respond_with_data("ok")
    with pytest.raises(InvalidParams) as caught:
        HttpRequest().check({"method": "POST", "url": f"{base(web)}/elsewhere", "body": "x"}, ctx)
    assert caught.value.issues[0].message == (
        f"{base(web)} is the host's destination crm, which allows GET, HEAD; POST is not "
        "allowed there: use one of them or ask for another destination"
    )
    assert (
        run(HttpRequest(), {"method": "GET", "url": f"{base(web)}/elsewhere"}, ctx)["status"] == 200
    )
    other = {"method": "POST", "url": f"{base(web, 'other.test')}/elsewhere", "body": "x"}
    assert run(HttpRequest(resolver=resolver), other, ctx)["status"] == 200
    assert [r.method for r, _ in web.log] == ["GET", "POST"]


def test_destinations_sharing_an_origin_allow_what_any_of_them_allows(
    web: HTTPServer, make_ctx: MakeContext
) -> None:
    """crm (GET, HEAD) and crm-write (POST) on one server: a POST goes through crm-write
    or as a raw URL, not through crm; a DELETE is refused everywhere, naming both."""
    ctx = make_ctx(
        http(
            web,
            crm={"base_url": f"{base(web)}/api", "methods": ["GET", "HEAD"]},
            **{"crm-write": {"base_url": f"{base(web)}/api", "methods": ["POST"]}},
        )
    )
    handler = HttpRequest()
    handler.check({"method": "POST", "destination": "crm-write", "path": "/x", "body": "b"}, ctx)
    handler.check({"method": "POST", "url": f"{base(web)}/api/x", "body": "b"}, ctx)
    with pytest.raises(InvalidParams, match=REFUSAL.format("POST")):
        handler.check({"method": "POST", "destination": "crm", "path": "/x", "body": "b"}, ctx)
    with pytest.raises(
        InvalidParams, match="destination crm, crm-write, which allows GET, HEAD, POST"
    ):
        handler.check({"method": "DELETE", "url": f"{base(web)}/api/x"}, ctx)


def test_a_get_redirected_within_a_get_only_destination_stays_a_get(
    web: HTTPServer, make_ctx: MakeContext
) -> None:
    """307 and 301 keep a GET a GET; the hops arrive as GETs and the answer comes back."""
    web.expect_request("/api/a").respond_with_data("", 307, {"Location": "/api/b"})
    web.expect_request("/api/b").respond_with_data("", 301, {"Location": "/api/c"})
    web.expect_request("/api/c").respond_with_data("landed")
    out = run(
        HttpRequest(),
        {"method": "GET", "destination": "crm", "path": "/a", "follow_redirects": True},
        make_ctx(read_only(web)),
    )
    assert out["body"] == "landed" and len(out["redirects"]) == 2
    assert [r.method for r, _ in web.log] == ["GET", "GET", "GET"]


@pytest.mark.parametrize("status", [307, 308])
def test_a_redirect_may_not_carry_a_post_to_a_get_only_destination(
    web: HTTPServer, resolver: FakeResolver, make_ctx: MakeContext, status: int
) -> None:
    """inbox takes POSTs; its 307/308 (which keep the method and the body) to the origin
    of the GET-only destination reports is refused: reports never receives the POST."""
    reports = base(web, "other.test")
    settings = http(
        web,
        inbox={"base_url": f"{base(web)}/in", "methods": ["POST"]},
        reports={"base_url": f"{reports}/r", "methods": ["GET"]},
    )
    web.expect_request("/in/new").respond_with_data("", status, {"Location": f"{reports}/r/x"})
    with pytest.raises(EffectFailed) as caught:
        run(
            HttpRequest(resolver=resolver),
            {"method": "POST", "destination": "inbox", "path": "/new", "json": {"a": 1},
             "follow_redirects": True},
            make_ctx(settings),
        )  # fmt: skip
    assert caught.value.reason == (
        f"failed: refused to follow the redirect to {reports}/r/x: {reports} is the host's "
        "destination reports, which allows GET; POST is not allowed there: use one of them "
        "or ask for another destination"
    )
    assert [(r.method, r.host) for r, _ in web.log] == [("POST", f"127.0.0.1:{web.port}")]


def test_a_303_may_not_turn_a_post_only_destination_into_a_get(
    web: HTTPServer, make_ctx: MakeContext
) -> None:
    """A 303 back to a POST-only destination would send its credentials with a GET: refused."""
    settings = http(web, inbox={"base_url": f"{base(web)}/in", "methods": ["POST"]})
    web.expect_request("/in/new").respond_with_data("", 303, {"Location": "/in/done"})
    with pytest.raises(EffectFailed, match="destination inbox allows POST; GET is not allowed"):
        run(
            HttpRequest(),
            {"method": "POST", "destination": "inbox", "path": "/new", "body": "x",
             "follow_redirects": True},
            make_ctx(settings),
        )  # fmt: skip
    assert len(web.log) == 1


def test_the_preview_shows_what_the_destination_allows(
    web: HTTPServer, make_ctx: MakeContext
) -> None:
    """A reviewer reads the methods fact: the list, or that none is set, or no destination."""
    handler = HttpRequest()
    ctx = make_ctx(http(
        web,
        crm={"base_url": f"{base(web)}/api", "methods": ["head", "get"]},
    ))  # fmt: skip

    def fact(**params: Any) -> str:
        return dict(handler.preview({"method": "GET", **params}, ctx).facts)["methods"]

    assert fact(destination="crm", path="/x") == (
        "GET, HEAD only (destination crm); no other is sent there"
    )
    assert fact(url=f"{base(web)}/x").startswith("GET, HEAD only (destination crm)")
    assert (
        fact(url="http://127.0.0.2/x") == "any: a URL from the request, at no destination's origin"
    )
    open_ctx = make_ctx(http(web, crm={"base_url": f"{base(web)}/api"}))
    facts = dict(
        handler.preview({"method": "GET", "destination": "crm", "path": "/"}, open_ctx).facts
    )
    assert facts["methods"] == "any: destination crm lists no methods"
    assert web.log == []


def test_the_documented_destination_loads_get_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The crm destination in docs/effects-network.md loads, and takes GET and HEAD only."""
    text = (Path(__file__).parents[2] / "docs" / "effects-network.md").read_text()
    block = text.split("## `http.request`", 1)[1].split("```toml", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("CRM_TOKEN", "t")
    table = tomllib.loads(block)["integrations"]["http"]
    crm = settings_from({"destinations": table["destinations"]}).destinations["crm"]
    assert crm.methods == ("GET", "HEAD") and not crm.allows("POST")
