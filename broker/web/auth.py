"""Who may decide on the web: approvers named in broker.toml, each with a token kept
only as its sha256; browser sessions; CSRF tokens for form posts.

    [approvers.alice]
    token_sha256 = "…"        # `broker web token alice` prints a token and this line
    slack_user = "U0123ABCD"  # optional: her clicks in Slack count as hers (broker.slack)

The API takes `Authorization: Bearer <token>`. The browser signs in with the token
once and then carries a session cookie (HttpOnly, SameSite=Strict); every form it
posts carries the session's CSRF token. The name recorded on a decision is always the
authenticated approver's (its table's name, normalised by broker.identity), never one
the client sends.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.clock import REAL, Clock
from broker.errors import ConfigError, DecisionError
from broker.identity import Proof, approver_name
from broker.people import PERSON_KEYS, People
from broker.settings import only_keys

if TYPE_CHECKING:
    from starlette.requests import Request

SESSION_COOKIE = "broker_session"
LOGIN_COOKIE = "broker_login"
APPROVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TOML_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
MAX_SESSIONS = 10_000


def new_token() -> str:
    """A fresh approver token: 256 random bits, URL-safe."""
    return "bkr_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def config_lines(name: str, token: str) -> str:
    """The broker.toml lines that let `name` sign in with `token`."""
    key = name if _TOML_BARE_KEY.fullmatch(name) else f'"{name}"'
    return f'[approvers.{key}]\ntoken_sha256 = "{hash_token(token)}"\n'


def load_approvers(table: Mapping[str, Any]) -> dict[str, str]:
    """[approvers.NAME] tables → {name: token sha256}; a mistake names its key. An
    approver with only a slack_user (checked by broker.slack) has no token here."""
    digests: dict[str, str] = {}
    for name, entry in table.items():
        where = f"approvers.{name}"
        if not APPROVER_NAME.fullmatch(name):
            raise ConfigError(
                f"[{where}]: an approver's name is letters, digits and _.@- (at most 64)"
            )
        if not isinstance(entry, Mapping):
            raise ConfigError(f'[{where}] must be a table with token_sha256 = "…"')
        if "token" in entry:
            raise ConfigError(
                f"{where}.token: a token is never written in broker.toml; write its "
                f"token_sha256 instead (`broker web token {name}` prints it)"
            )
        only_keys(where, entry, {"token_sha256", "slack_user", "github_user", *PERSON_KEYS})
        if "token_sha256" not in entry and set(entry) & {"slack_user", "github_user", *PERSON_KEYS}:
            continue  # decides in Slack, the CLI or with the identity provider only
        person = _person(name, where, digests)
        digest = entry.get("token_sha256")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest.lower()):
            raise ConfigError(
                f"{where}.token_sha256: expected the sha256 of the token as 64 hex digits"
            )
        for other, known in digests.items():
            if known == digest.lower():
                raise ConfigError(
                    f"{where}.token_sha256: the same token as approvers.{other}; "
                    "each person needs their own"
                )
        digests[person] = digest.lower()
    return digests


def _person(name: str, where: str, known: Mapping[str, str]) -> str:
    """The approver's normalised name (broker.identity): what decisions record and a
    quorum counts; two tables naming one person are refused."""
    try:
        person = approver_name(name)
    except DecisionError as exc:
        raise ConfigError(f"[{where}]: {exc}") from exc
    if person in known:
        raise ConfigError(
            f"[{where}]: the same person as another [approvers] table ({person}); "
            "names are compared trimmed and case-folded"
        )
    return person


@dataclass(frozen=True)
class Session:
    """A signed-in browser: who, its CSRF token, and when it ends (monotonic seconds);
    `proof` when it signed in with the identity provider (it ends with the ID token)."""

    approver: str
    csrf: str
    expires: float
    proof: Proof | None = None


@dataclass(frozen=True)
class Identity:
    """An authenticated approver and how they came: `api` (bearer) or `web` (cookie)."""

    approver: str
    surface: str
    session: Session | None = None

    @property
    def proof(self) -> Proof | None:
        return self.session.proof if self.session is not None else None


class Sessions:
    """Browser sessions in memory: a broker restart signs everyone out."""

    def __init__(self, ttl_s: float, clock: Clock = REAL) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, approver: str, proof: Proof | None = None) -> tuple[str, Session]:
        """A new session for `approver`: `ttl_s` long, or less when its token ends sooner."""
        sid = secrets.token_urlsafe(32)
        life = self.ttl_s
        if proof is not None:
            life = min(life, proof.expires - self.clock.now().timestamp())
        session = Session(approver, secrets.token_urlsafe(32), self.clock.monotonic() + life, proof)
        with self._lock:
            moment = self.clock.monotonic()
            for old in [k for k, s in self._by_id.items() if s.expires <= moment]:
                del self._by_id[old]
            while len(self._by_id) >= MAX_SESSIONS:
                del self._by_id[next(iter(self._by_id))]
            self._by_id[sid] = session
        return sid, session

    def get(self, sid: str) -> Session | None:
        with self._lock:
            session = self._by_id.get(sid)
            if session is not None and session.expires <= self.clock.monotonic():
                del self._by_id[sid]
                return None
            return session

    def close(self, sid: str) -> None:
        with self._lock:
            self._by_id.pop(sid, None)


class Gate:
    """Turns a request's bearer token or session cookie into an Identity, or None."""

    def __init__(
        self, approvers: Mapping[str, str], sessions: Sessions, people: People | None = None
    ) -> None:
        self.approvers = dict(approvers)
        self.sessions = sessions
        self.people = people or People()

    def identify(self, token: str) -> str | None:
        """The approver whose live token this is; every digest is compared, in constant
        time; a token past its `token_expires` is nobody's."""
        digest = hash_token(token)
        found = None
        for name, known in self.approvers.items():
            if hmac.compare_digest(digest, known):
                found = name
        if found is not None and not self.people.token_live(found, self.sessions.clock.now()):
            return None
        return found

    def identity(self, request: Request) -> Identity | None:
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return None
            name = self.identify(token.strip())
            return Identity(name, "api") if name else None
        sid = request.cookies.get(SESSION_COOKIE)
        session = self.sessions.get(sid) if sid else None
        if session is None:
            return None
        if session.proof is None and (
            session.approver not in self.approvers
            or not self.people.token_live(session.approver, self.sessions.clock.now())
        ):
            return None  # a token session ends when its token is revoked or expires
        return Identity(session.approver, "web", session)


def same_secret(expected: str, supplied: str | None) -> bool:
    """Constant-time comparison of a CSRF token; a missing one never matches."""
    return bool(supplied) and hmac.compare_digest(expected.encode(), str(supplied).encode())
