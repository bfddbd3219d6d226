"""The token on each GitHub approval thread call.

When [integrations.github] names a provider (`credential = "NAME"` with
`[credentials.NAME] kind = "github_app"`, or the App's keys in the table itself), a
thread call carries a token minted through the credential seam (broker.grants) for
that one repository: `checks`, `issues` and `pull_requests` write (with `metadata`
read), or `contents` write for the staging branch's ref calls only. A token is reused
for `REUSE_S` (a thread's opening is some ten calls) and then revoked, as every token
left when the surface closes; none crosses to another repository. Without a
provider the calls carry the standing `token_env` / `token_file`: `kind` says which.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from broker.clock import REAL, Clock
from broker.errors import EffectFailed
from broker.grants import STANDING, Grant, Provider, Scope

__all__ = ["REF_PERMISSIONS", "THREAD_PERMISSIONS", "ThreadTokens"]

log = logging.getLogger("broker.integrations.github")
REUSE_S = 300.0
THREAD_PERMISSIONS = ("checks:write", "issues:write", "metadata:read", "pull_requests:write")
REF_PERMISSIONS = ("contents:write", "metadata:read")


@dataclass(frozen=True)
class _Held:
    grant: Grant
    since: float


class ThreadTokens:
    """Mints (and revokes) the thread calls' tokens, or hands out the standing one."""

    def __init__(
        self,
        base_url: str,
        standing: str | None,
        provider: Provider | None,
        clock: Clock = REAL,
    ) -> None:
        self.base_url = base_url
        self.standing = standing
        self.provider = provider
        self.clock = clock
        self._held: dict[Scope, _Held] = {}
        self._lock = threading.Lock()

    @property
    def kind(self) -> str:
        """In words, what the thread's calls carry (for the log and `broker effects`)."""
        if self.provider is None:
            return STANDING
        name = getattr(self.provider, "name", type(self.provider).__name__)
        return f"minted per repository ({name}): checks, issues, pull_requests; contents for refs"

    def scope(self, repo: str, path: str) -> Scope:
        """What a call on `path` needs of `repo`."""
        actions = REF_PERMISSIONS if "/git/" in path else THREAD_PERMISSIONS
        return Scope("github", (repo,), actions, endpoint=self.base_url)

    def token(self, repo: str, method: str, path: str) -> str:
        """The token for one call; raises EffectFailed (CredentialRefused) when none."""
        if self.provider is None:
            if not self.standing:
                raise EffectFailed("no GitHub token for the approval threads")
            return self.standing
        scope = self.scope(repo, path)
        now = self.clock.monotonic()
        with self._lock:
            held = self._held.get(scope)
            if held is not None and now - held.since < REUSE_S:
                return held.grant.token
            stale = self._held.pop(scope, None)
        if stale is not None:
            self._revoke(stale.grant)
        grant = self.provider.mint(scope, f"github approval thread {repo}")
        with self._lock:
            self._held[scope] = _Held(grant, now)
        return grant.token

    def close(self) -> None:
        """Revoke every token still held."""
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for each in held:
            self._revoke(each.grant)

    def _revoke(self, grant: Grant) -> None:
        assert self.provider is not None
        try:
            self.provider.revoke(grant)
        except Exception as exc:  # it expires by itself within the hour
            log.warning("could not revoke the thread token %s: %s", grant.id, exc)
