"""The canary, for credentials minted per apply (issue 25): every effect that holds a
secret, per provider, with a hostile service echoing what it was sent; the minted
credential (and the provider's own token for the read) is in no result, ledger row,
audit line or log line (the detector of tests/security/test_canary.py).

- OpenBao (a real `bao server -dev`): http.request's header, webhook.post's URL and
  key, email.send's password, read per apply; the child token of each read too.
- GitHub App (the fake GitHub minting narrowed tokens): github.issue.comment and
  git.push against stand-ins echoing the token they got.
- AWS STS (moto's STS in server mode): s3.put_object against an S3 stand-in echoing
  the session's key id, its signature header and its session token.
"""

from __future__ import annotations

import base64
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import trustme
from moto.server import ThreadedMotoServer

from broker.credentials.openbao import CHILD_KEY, OpenBao
from broker.grants import Grant, Scope
from broker.testing import BrokerHarness
from tests.credentials import bao as bao_server
from tests.effects.github.fake import FakeGitHub, seed_repo
from tests.effects.github.support import SEED, app_key
from tests.security.conftest import Echo
from tests.security.test_canary import CANARY, _TLSServer, assert_no_canary, every_echo, run_one

AUTO = '[[rules]]\neffect = "*"\naction = "auto"\nreason = "test"\n'
LOOPBACK = ["127.0.0.0/8"]


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server, url = bao_server.start(tmp_path_factory.mktemp("bao"))
    yield url
    bao_server.stop(server)


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The child tokens OpenBao made for each read (the real provider, observed)."""
    made: list[str] = []
    mint = OpenBao.mint

    def observed(self: OpenBao, scope: Scope, ref: str) -> Grant:
        grant = mint(self, scope, ref)
        made.append(grant.values[CHILD_KEY])
        return grant

    monkeypatch.setattr(OpenBao, "mint", observed)
    monkeypatch.setenv(bao_server.TOKEN_ENV, bao_server.ROOT_TOKEN)
    return made


def minted_broker(tmp_path: Path, bao: str, **integrations: dict[str, Any]) -> BrokerHarness:
    return BrokerHarness(
        tmp_path / "h",
        integrations={k: {"credential": "bao", **v} for k, v in integrations.items()},
        credentials={"bao": bao_server.table(bao)},
        policy=AUTO,
    )


def test_openbao_http_header_echoed_in_every_form(
    tmp_path: Path,
    bao: str,
    children: list[str],
    echo: Callable[..., Echo],
    verbose: pytest.LogCaptureFixture,
) -> None:
    """http.request: the KV bearer echoed raw, base64, URL-encoded, as Basic."""
    bao_server.put(bao, "canary/http", {"token": CANARY})
    server = echo(lambda req, body: (200, "text/plain", every_echo(req.headers["X-Key"]).encode()))
    header = {"value_kv": "canary/http#token", "prefix": "Bearer "}
    dest = {"base_url": server.url, "secret_headers": {"X-Key": header}, "response": "body"}
    with minted_broker(
        tmp_path, bao, http={"allow_networks": LOOPBACK, "destinations": {"d": dest}}
    ) as h:
        out = run_one(h, "http.request", {"method": "GET", "destination": "d", "path": "/e"})
        assert (
            out["status"] == "applied" and server.seen[0]["headers"]["X-Key"] == f"Bearer {CANARY}"
        )
        assert_no_canary(h, verbose, CANARY, *children)
    assert len(children) == 1


def test_openbao_webhook_url_and_key_echoed(
    tmp_path: Path,
    bao: str,
    children: list[str],
    echo: Callable[..., Echo],
    verbose: pytest.LogCaptureFixture,
) -> None:
    """webhook.post: a receiver echoing its secret path (raw and base64) and failing."""

    def answer(req: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str, bytes]:
        said = f"no hook at {req.path}; b64 {base64.b64encode(req.path.encode()).decode()}"
        return 404, "text/plain", said.encode()

    server = echo(answer)
    bao_server.put(bao, "canary/hook", {"url": f"{server.url}/hook/{CANARY}", "key": CANARY[::-1]})
    target = {"url_kv": "canary/hook#url", "secret_kv": "canary/hook#key", "retries": 0}
    target["response"] = "body"
    with minted_broker(
        tmp_path, bao, webhook={"allow_networks": LOOPBACK, "targets": {"t": target}}
    ) as h:
        out = run_one(h, "webhook.post", {"target": "t", "payload": {"a": 1}})
        assert out["status"] == "failed" and server.seen
        assert_no_canary(h, verbose, CANARY, CANARY[::-1], *children)


def test_openbao_smtp_password_echoed(
    tmp_path: Path, bao: str, children: list[str], verbose: pytest.LogCaptureFixture
) -> None:
    """email.send: an SMTPS server refusing AUTH PLAIN and echoing what it got."""
    bao_server.put(bao, "canary/smtp", {"password": CANARY})
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = _TLSServer(context)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    email = {
        "host": "127.0.0.1",
        "port": server.server_address[1],
        "security": "ssl",
        "ca_file": str(ca_file),
        "username": "robot",
        "password_kv": "canary/smtp#password",
        "from": "robot@example.com",
        "allow_domains": ["example.com"],
    }
    try:
        with minted_broker(tmp_path, bao, email=email) as h:
            params = {"to": ["a@example.com"], "subject": "s", "text": "t"}
            out = run_one(h, "email.send", params)
            assert out["status"] == "failed" and "535" in out["reason"], out
            assert_no_canary(h, verbose, CANARY, *children)
    finally:
        server.shutdown()
        server.server_close()


class EchoingGitHub(FakeGitHub):
    """The fake GitHub, minting narrowed tokens, whose comments API echoes the token."""

    def _call(
        self,
        fn: Any,
        params: dict[str, str],
        query: dict[str, str],
        body: Any,
        auth: str,
        route: str,
    ) -> Any:
        if route.endswith("/comments"):
            said = {
                "message": f"Validation Failed for {auth}",
                "errors": [{"message": every_echo(auth)}],
            }
            return 422, said
        return super()._call(fn, params, query, body, auth, route)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[EchoingGitHub, dict[str, Any]]]:
    key_file, public = app_key(tmp_path)
    repo = tmp_path / "api.git"
    seed_repo(repo, SEED)
    with EchoingGitHub(token="standing-never-used", app=(4242, public, 77)) as fake:
        fake.add_repo("acme/api", repo)
        table = {"kind": "github_app", "app_id": 4242, "installation_id": 77}
        yield fake, {**table, "private_key_file": str(key_file), "base_url": fake.url}


def test_github_app_token_echoed_by_the_comments_api(
    tmp_path: Path, app: tuple[EchoingGitHub, dict[str, Any]], verbose: pytest.LogCaptureFixture
) -> None:
    """github.issue.comment: a 422 carrying the minted token in every form."""
    fake, table = app
    github = {"base_url": fake.url, "repos": ["acme/*"], "credential": "acme-app"}
    with BrokerHarness(
        tmp_path / "h",
        integrations={"github": github},
        credentials={"acme-app": table},
        policy=AUTO,
    ) as h:
        out = run_one(h, "github.issue.comment", {"repo": "acme/api", "number": 1, "body": "hi"})
        assert out["status"] == "failed"
        (token,) = fake.revoked
        assert_no_canary(h, verbose, token)


def test_github_app_token_echoed_by_a_git_server(
    tmp_path: Path,
    app: tuple[EchoingGitHub, dict[str, Any]],
    echo: Callable[..., Echo],
    verbose: pytest.LogCaptureFixture,
) -> None:
    """git.push: a git server answering `ERR access denied for Basic <user:token>`."""
    fake, table = app

    def answer(req: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str, bytes]:
        msg = f"ERR access denied for {req.headers.get('Authorization')}"
        return (
            200,
            "application/x-git-upload-pack-advertisement",
            b"%04x%s\n" % (len(msg) + 5, msg.encode()),
        )

    server = echo(answer)
    bundle = _bundle(tmp_path)
    remote = {"url": f"{server.url}/acme/api.git", "api_url": fake.url}
    git = {"remotes": {"origin": remote}, "credential": "acme-app"}
    with BrokerHarness(
        tmp_path / "h", integrations={"git": git}, credentials={"acme-app": table}, policy=AUTO
    ) as h:
        doc = h.request(
            "git.push",
            {"remote": "origin", "branch": "agent/x", "bundle": "b", "expected_old": None},
            attachments=["b"],
        )
        h.write(f"{doc['id']}.b.bin", bundle.read_bytes())
        out = h.submit(doc, timeout=30)
        assert out["status"] == "failed" and server.seen, out
        assert fake.revoked, "no token was minted"
        assert_no_canary(h, verbose, *fake.revoked)


def _bundle(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a"}
    env |= {"GIT_COMMITTER_EMAIL": "a@b", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    (work / "a.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(work), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "a"], check=True, env=env)
    bundle = tmp_path / "b.bundle"
    subprocess.run(
        ["git", "-C", str(work), "bundle", "create", "-q", str(bundle), "main"], check=True, env=env
    )
    return bundle


@pytest.fixture(scope="module")
def sts() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_sts_session_echoed_by_the_s3_service(
    tmp_path: Path,
    sts: str,
    echo: Callable[..., Echo],
    verbose: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """s3.put_object: an S3 stand-in answering 403 with the session's key id, the
    Authorization header and the X-Amz-Security-Token it got."""
    from moto.sts.models import sts_backends

    def answer(req: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str, bytes]:
        auth = req.headers.get("Authorization", "")
        token = req.headers.get("X-Amz-Security-Token", "")
        xml = (
            "<?xml version='1.0'?><Error><Code>InvalidAccessKeyId</Code><Message>"
            f"denied: {auth} {token} {base64.b64encode(token.encode()).decode()}</Message></Error>"
        )
        return 403, "application/xml", xml.encode()

    server = echo(answer)
    monkeypatch.setenv("CANARY_STS_KEY", "broker-key-id")
    monkeypatch.setenv("CANARY_STS_SECRET", "broker-secret")
    writer = {
        "kind": "aws_sts",
        "role_arn": "arn:aws:iam::123456789012:role/broker-s3",
        "region": "us-east-1",
        "endpoint_url": sts,
        "access_key_id_env": "CANARY_STS_KEY",
        "secret_access_key_env": "CANARY_STS_SECRET",
    }
    s3 = {
        "allow": ["scratch/*"],
        "endpoint_url": server.url,
        "region": "us-east-1",
        "addressing_style": "path",
        "credential": "writer",
    }
    with BrokerHarness(
        tmp_path / "h", integrations={"s3": s3}, credentials={"writer": writer}, policy=AUTO
    ) as h:
        out = run_one(h, "s3.put_object", {"bucket": "scratch", "key": "a.txt", "body": "x"})
        assert out["status"] == "failed" and server.seen, out
        arns = {u["id"] for u in out["output"]["credential"]}  # every session of the apply
        roles = [
            r
            for backend in sts_backends.values()
            for partition in backend.values()
            for r in partition.assumed_roles
            if any(arn.endswith(f"/{r.session_name}") for arn in arns)
        ]
        assert roles, arns
        secrets = [
            s for r in roles for s in (r.access_key_id, r.secret_access_key, r.session_token)
        ]
        sent = " ".join(s["headers"].get("Authorization", "") for s in server.seen)
        assert any(r.access_key_id in sent for r in roles)
        assert_no_canary(h, verbose, *secrets)
