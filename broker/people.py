"""One person on every surface: the `[approvers.NAME]` keys that say who someone is
outside the inbox's token, so a quorum counts them once wherever they decide.

    [approvers.alice]
    token_sha256 = "…"            # the inbox and the API (broker.web.auth)
    token_expires = "2027-01-31T00:00:00Z"   # optional: the token stops working then
    slack_user = "U0123ABCD"      # her clicks in Slack (broker.slack.settings)
    os_user = "asmith"            # `broker approve` run by this OS account is alice
    oidc_sub = "248289761001"     # the [web.oidc] issuer's subject (or a list of them)

    [approvers.pr-bot]
    oidc_sub = "bot|1234"
    acts_for = ["pr-*"]           # the agent of these sandboxes: never decides their requests

An API token bound to a person with `oidc_sub` decides as that person, the same as
their OIDC sign-in; `acts_for` globs match a sandbox's name (`HOST.SANDBOX` in a fleet
matches by either form).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any

from broker.errors import ConfigError, DecisionError
from broker.identity import Proof, approver_name, oidc_person

__all__ = ["PERSON_KEYS", "People"]

PERSON_KEYS = frozenset({"token_expires", "os_user", "oidc_sub", "acts_for"})
"""The keys of an [approvers.NAME] table this module reads (auth and Slack read theirs)."""


@dataclass(frozen=True)
class People:
    """Who is who across surfaces, read from [approvers]."""

    os_users: Mapping[str, str] = field(default_factory=dict)  # OS account → approver
    subjects: Mapping[str, str] = field(default_factory=dict)  # OIDC sub → approver
    agents: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # approver → globs
    token_expiry: Mapping[str, datetime] = field(default_factory=dict)

    @classmethod
    def of(cls, table: Mapping[str, Any]) -> People:
        """Read every [approvers.NAME]'s person keys; a mistake names its key."""
        os_users: dict[str, str] = {}
        subjects: dict[str, str] = {}
        agents: dict[str, tuple[str, ...]] = {}
        expiry: dict[str, datetime] = {}
        for raw, entry in table.items():
            if not isinstance(entry, Mapping):
                continue  # broker.web.auth names this mistake
            where = f"approvers.{raw}"
            try:
                name = approver_name(raw)
            except DecisionError as exc:
                raise ConfigError(f"[{where}]: {exc}") from exc
            for account in _strings(where, "os_user", entry.get("os_user")):
                _claim(os_users, _os_account(where, account), name, f"{where}.os_user")
            for sub in _strings(where, "oidc_sub", entry.get("oidc_sub")):
                _claim(subjects, sub, name, f"{where}.oidc_sub")
            globs = _strings(where, "acts_for", entry.get("acts_for"))
            if globs:
                agents[name] = globs
            if "token_expires" in entry:
                expiry[name] = _instant(f"{where}.token_expires", entry["token_expires"])
        return cls(os_users, subjects, agents, expiry)

    def of_os_user(self, account: str) -> str:
        """The approver an OS account decides as (itself unless an os_user maps it)."""
        return self.os_users.get(account, account)

    def of_proof(self, proof: Proof) -> str:
        """The approver an OIDC sign-in is: the one whose oidc_sub it is, else its own."""
        return self.subjects.get(proof.subject) or oidc_person(proof.issuer, proof.subject)

    def acts_for(self, person: str, sandbox: str) -> bool:
        """Whether `person` is the agent of `sandbox` (then it never decides its requests)."""
        local = sandbox.split(".", 1)[-1]
        return any(
            fnmatchcase(sandbox, glob) or fnmatchcase(local, glob)
            for glob in self.agents.get(person, ())
        )

    def token_live(self, person: str, now: datetime) -> bool:
        ends = self.token_expiry.get(person)
        return ends is None or now < ends


def _strings(where: str, key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v.strip() for v in items):
        raise ConfigError(f"{where}.{key}: expected a string or a list of strings")
    return tuple(v.strip() for v in items)


def _os_account(where: str, account: str) -> str:
    try:
        return approver_name(account)
    except DecisionError as exc:
        raise ConfigError(f"{where}.os_user: {exc}") from exc


def _claim(into: dict[str, str], key: str, name: str, where: str) -> None:
    if into.get(key, name) != name:
        raise ConfigError(f"{where}: {key!r} is already approvers.{into[key]}'s; one person each")
    into[key] = name


def _instant(where: str, value: Any) -> datetime:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ConfigError(
                f"{where}: expected a date and time such as 2027-01-31T00:00:00Z"
            ) from None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ConfigError(f"{where}: expected a date and time with its zone, e.g. …T00:00:00Z")
    return value.astimezone(UTC)
