"""A real OpenID Connect provider on 127.0.0.1 for the tests: PyPI's oidc-provider-mock
(Authlib's server: discovery, JWKS, the code flow, a login form), served by werkzeug in
a process of its own. People are set through its own API (`PUT /users/SUB`) with their claims."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx


@dataclass
class Issuer:
    """The running provider: its URL (the issuer) and a client to its own API."""

    url: str
    http: httpx.Client

    def person(self, sub: str, **claims: Any) -> None:
        """Create or replace the person `sub` with these claims (name, groups, amr…)."""
        response = self.http.put(f"/users/{sub}", json=claims)
        assert response.status_code == 204, response.text

    def log_in(self, authorize_url: str, sub: str) -> str:
        """Sign `sub` in on the provider's own form; the redirect back (callback URL)."""
        response = self.http.post(authorize_url, data={"sub": sub})
        assert response.status_code == 302, response.text
        return response.headers["location"]


def code_of(callback_url: str) -> tuple[str, str]:
    """The code and state a callback URL carries."""
    query = parse_qs(urlsplit(callback_url).query)
    return query["code"][0], query["state"][0]


# Run in a process of its own: its Authlib server code warns of its own deprecations,
# which this suite's filterwarnings=error would turn into 500s inside its thread.
SERVE = """
import sys, warnings
warnings.simplefilter("ignore")
import oidc_provider_mock, werkzeug.serving
app = oidc_provider_mock.app(require_nonce=False, issue_refresh_token=False)
server = werkzeug.serving.make_server("127.0.0.1", 0, app, threaded=True)
print(server.server_port, flush=True)
server.serve_forever(0.05)
"""


@contextmanager
def running_provider() -> Iterator[Issuer]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=10) as http:
            yield Issuer(url, http)
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
