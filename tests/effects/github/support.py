"""What the github.* tests share: the fake GitHub's hub, request builders, an App key."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from broker.context import Memo
from broker.testing import make_context
from effects.base import Context
from tests.effects.github.fake import FakeGitHub, commit_on, git

TOKEN_ENV = "TEST_BROKER_GITHUB_TOKEN"
TOKEN = "ghp_testtoken0123456789notreal"
REPO = "acme/api"
SEED = {"README.md": "hello\n", "src/app.py": "x = 1\n", "docs/guide.md": "# Guide\n"}


@dataclass
class Hub:
    """A fake GitHub serving acme/api, backed by a bare repository with a main branch."""

    fake: FakeGitHub
    remote: Path
    state: Path
    settings: dict[str, Any]
    memos: dict[str, Memo] = dataclasses.field(default_factory=dict)

    def ctx(
        self,
        request_id: str = "r1",
        credentials: dict[str, dict[str, Any]] | None = None,
        **settings: Any,
    ) -> Context:
        """A handler's context; settings given here override the hub's (None: removed).
        One Memo per request id, as the broker keeps what a preview saw until apply."""
        table = {k: v for k, v in {**self.settings, **settings}.items() if v is not None}
        return make_context(
            table,
            integration="github",
            sandbox="sb",
            request_id=request_id,
            request_sha256=hashlib.sha256(request_id.encode()).hexdigest(),
            state_dir=self.state,
            memo=self.memos.setdefault(request_id, Memo()),
            credentials=credentials,
        )

    def sha(self, branch: str) -> str | None:
        try:
            return git(self.remote, "rev-parse", "--verify", "--quiet", branch).strip() or None
        except Exception:
            return None

    def show(self, rev: str, path: str) -> str:
        return git(self.remote, "show", f"{rev}:{path}")

    def push(self, branch: str, files: dict[str, str | None], start: str = "main") -> str:
        """What an agent's git.push leaves on the remote: a branch with one commit."""
        data = {p: (c.encode() if c is not None else None) for p, c in files.items()}
        return commit_on(self.remote, branch, data, "agent change", start=start)


def pr(**kw: Any) -> dict[str, Any]:
    return {"repo": REPO, "head": "agent/fix", "base": "main", "title": "Fix x", **kw}


def posted(hub: Hub, route: str) -> list[Any]:
    return [c.body for c in hub.fake.called("POST", route)]


PULLS = "/repos/{owner}/{repo}/pulls"


FILES = [
    {"path": "README.md", "content": "hello, world\n"},
    {"path": "docs/new/page.md", "content": "new\n"},
    {"path": "src/app.py", "delete": True},
]


def app_key(tmp_path: Path) -> tuple[Path, str]:
    """A fresh RSA key for a test GitHub App: (private key file, public key PEM)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / "app.pem"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return path, public.decode()
