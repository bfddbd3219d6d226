"""Issue 24 finding 1: a service echoing the injected credential in any of 20 encodings,
or split over two response headers, gets 0 canary characters (no run of 8) back into
the sandbox, the ledger, the audit log or the log: what returns is allow-listed
(`response`, "status" by default for a destination the host sends a secret to).

Masking stays as the second line; `test_masker_masks_exactly_what_the_docs_list` pins
which of the 20 it catches on its own (docs/security.md lists the same). Every server
is on 127.0.0.1.
"""

from __future__ import annotations

import base64
import codecs
import gzip
import json
import logging
import quopri
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from broker.masking import Masker
from broker.testing import BrokerHarness
from tests.security.test_canary import pieces, written

CANARY = "Cnry-7F3a9C1e5B2d4F6a8E0c"  # mixed case, so "upper" and "lower" differ from it

ENCODINGS: dict[str, Callable[[str], bytes]] = {
    "raw": lambda s: s.encode(),
    "base64": lambda s: base64.b64encode(s.encode()),
    "urlsafe-base64": lambda s: base64.urlsafe_b64encode(s.encode()),
    "quoted-printable": lambda s: quopri.encodestring(s.encode()),
    "hex": lambda s: s.encode().hex().encode(),
    "base32": lambda s: base64.b32encode(s.encode()),
    "gzip-base64": lambda s: base64.b64encode(gzip.compress(s.encode(), mtime=0)),
    "utf-16": lambda s: s.encode("utf-16"),
    "reversed": lambda s: s[::-1].encode(),
    "all-percent": lambda s: "".join(f"%{b:02X}" for b in s.encode()).encode(),
    "all-u-escapes": lambda s: "".join(f"\\u{ord(c):04x}" for c in s).encode(),
    "upper": lambda s: s.upper().encode(),
    "lower": lambda s: s.lower().encode(),
    "base64-wrapped-8": lambda s: b"\n".join(
        base64.b64encode(s.encode())[i : i + 8] for i in range(0, 64, 8)
    ),
    "html-entities": lambda s: "".join(f"&#{ord(c)};" for c in s).encode(),
    "spaced": lambda s: " ".join(s).encode(),
    "rot13": lambda s: codecs.encode(s, "rot13").encode(),
    "hex-colons": lambda s: ":".join(f"{b:02x}" for b in s.encode()).encode(),
    "base85": lambda s: base64.b85encode(s.encode()),
    "ascii85": lambda s: base64.a85encode(s.encode()),
}
# what masking alone catches (docs/security.md, "Secrets do not leak by echo")
MASKED = {
    "raw", "base64", "urlsafe-base64", "quoted-printable", "hex", "all-percent",
    "all-u-escapes", "upper", "lower", "base64-wrapped-8", "html-entities",
}  # fmt: skip


def hidden(text: str, secret: str) -> bool:
    """Whether any 8 characters of `secret` (any case) are in `text`."""
    low = text.lower()
    return any(p.lower() in low for p in pieces(secret))


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_masker_masks_exactly_what_the_docs_list(name: str) -> None:
    """Each encoding of a token in a longer text: masked when the docs say so; the
    others come back decodable, which is why responses are allow-listed."""
    echoed = ENCODINGS[name](CANARY).decode("latin-1")
    out = Masker([CANARY]).text(f"auth was: {echoed} (debug)")
    assert (echoed not in out) is (name in MASKED), out
    if name in MASKED:
        assert not hidden(out, echoed.strip()), out


class _Echo(BaseHTTPRequestHandler):
    """/enc/NAME: the Authorization header in that encoding; /split: its first 12
    characters in X-A and the rest in X-B; /doc: a JSON document."""

    def do_GET(self) -> None:
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        self.send_response(200)
        if self.path == "/api/split":
            self.send_header("X-A", token[:12])
            self.send_header("X-B", token[12:])
            body = b"{}"
        elif self.path == "/api/doc":
            body = json.dumps({"a": 1, "b": ["x"], "c": "not asked for"}).encode()
        else:
            body = ENCODINGS[self.path.rsplit("/", 1)[1]](token)
        self.send_header("Content-Type", "text/plain; charset=latin-1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_no_canary_comes_back_in_any_of_20_encodings_or_split_headers(
    tmp_path: Path, echo: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's attack against a destination with a secret header and no `response`
    key: 21 requests applied, each result only the status and safe headers, and no run
    of 8 characters of the token, or of what the service echoed, anywhere written."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("CANARY_ENC", CANARY)
    crm = {
        "base_url": f"{echo}/api",
        "allow_networks": ["127.0.0.0/8"],
        "secret_headers": {"Authorization": {"value_env": "CANARY_ENC", "prefix": "Bearer "}},
    }
    settings = {"destinations": {"crm": crm}}
    paths = [f"/enc/{name}" for name in ENCODINGS] + ["/split"]
    with BrokerHarness(tmp_path / "h", integrations={"http": settings}) as h:
        for path in paths:
            params = {"method": "GET", "destination": "crm", "path": path}
            out = h.submit(h.request("http.request", params), timeout=30)
            assert out["status"] == "applied", out
            assert out["output"]["returned"] == "status"
            assert set(out["output"]) == {
                "status", "headers", "redirects_followed", "bytes", "truncated", "returned",
            }  # fmt: skip
            assert set(out["output"]["headers"]) <= {"content-type", "content-length"}
        everything = written(h, caplog.text)
    echoed = [ENCODINGS[n](CANARY).decode("latin-1") for n in ENCODINGS]
    for where, text in everything.items():
        assert not hidden(text, CANARY), f"the canary is in the {where}"
        for name, form in zip(ENCODINGS, echoed, strict=True):
            assert not hidden(text, form), f"the {name} echo is in the {where}"


def test_the_card_and_the_output_say_what_returns(tmp_path: Path, echo: str) -> None:
    """`response = {json = [...]}`: only those values come back, and the preview names
    them; a destination without secrets keeps the whole body."""
    from broker.testing import make_context
    from effects.http.handler import HttpRequest

    settings = {
        "allow_networks": ["127.0.0.0/8"],
        "destinations": {
            "picked": {"base_url": f"{echo}/api", "response": {"json": ["/a", "/b/0"]}},
            "open": {"base_url": f"{echo}/api"},
        },
    }
    ctx = make_context(settings, integration="http")
    handler = HttpRequest()
    params = {"method": "GET", "destination": "picked", "path": "/doc"}
    facts = dict(handler.preview(params, ctx).facts)
    assert facts["response"].startswith("status and these JSON values of the body only: /a, /b/0")
    out = handler.apply(params, ctx)
    assert (
        out["returned"] == "json" and out["json"] == {"/a": 1, "/b/0": "x"} and out["missing"] == []
    )
    whole = handler.apply({**params, "destination": "open"}, ctx)
    assert whole["returned"] == "body" and "not asked for" in whole["body"]
    assert (
        "status, headers and body"
        in dict(handler.preview(params | {"destination": "open"}, ctx).facts)["response"]
    )
    assert json.dumps(out)  # JSON-able, as a result must be


def test_outbox_effects_says_what_each_destination_returns(
    tmp_path: Path, echo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The published catalogue, and `outbox effects` in the sandbox, name what of an
    answer returns per destination and target: a secret-sending one "status only"."""
    import os
    import subprocess
    import sys

    from broker.loop.catalogue import CATALOGUE_NAME
    from tests.integrations.conftest import CLIENT

    monkeypatch.setenv("CANARY_ENC", CANARY)
    monkeypatch.setenv("HOOK_URL", f"{echo}/hook/{CANARY}")
    secret = {"Authorization": {"value_env": "CANARY_ENC"}}
    integrations: dict[str, Any] = {
        "http": {"destinations": {"crm": {"base_url": echo, "secret_headers": secret}}},
        "webhook": {"targets": {"ops": {"url_env": "HOOK_URL"}, "open": {"url": echo}}},
    }
    with BrokerHarness(tmp_path / "h", integrations=integrations) as h:
        doc = json.loads((h.results / CATALOGUE_NAME).read_bytes())
        by_name = {e["name"]: e for e in doc["effects"]}
        assert by_name["http.request"]["returns"]["destination crm"].startswith("status only")
        assert by_name["webhook.post"]["returns"]["target ops"].startswith("status only")
        assert by_name["webhook.post"]["returns"]["target open"].startswith("status, headers")
        assert "returns" not in by_name["files.write"]
        env = {**os.environ, "OUTBOX_DIR": str(h.outbox), "RESULTS_DIR": str(h.results)}
        done = subprocess.run(
            [sys.executable, str(CLIENT), "effects"], capture_output=True, text=True, env=env
        )
    assert done.returncode == 0, done.stderr
    assert "    returns, destination crm: status only" in done.stdout
    assert CANARY not in json.dumps(doc)
