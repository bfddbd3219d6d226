"""Frozen settings from broker.toml and the environment, read only on the host.

Secrets are always references (`*_env`, `*_file`), resolved here and nowhere else;
every resolved value is remembered so that anything written can be redacted.

Config and Limits are NamedTuples, not dataclasses (as are the records they hold): every
`broker run` loads them before its container is created, and the dataclasses module
and the code each frozen dataclass generates cost ~15 ms of every cold start. A
changed copy is `cfg._replace(...)`; a mapping left out is one shared, read-only
empty mapping.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from broker import fleet
from broker.errors import ConfigError
from broker.inputs import locate
from broker.repositories import Repositories
from broker.repositories import parse as parse_repositories
from broker.settings import Settings, check_no_literal_secrets, resolve_secret
from broker.staged import OFF, Staged

MiB = 1024 * 1024
BROKER_KEYS = {
    "state_dir",
    "policy",
    "max_request_bytes",
    "max_depth",
    "max_attachment_bytes",
    "attachment_grace",
    "rescan_interval",
    "allow_as",
    "max_pending_per_sandbox",
    "preview_timeout",
    "ledger",
    "ledger_password_env",
    "ledger_password_file",
    "host_id",
    "host_id_env",
    "staged",
    "log_format",
}


class Limits(NamedTuple):
    """Bounds on what a sandbox may hand the broker."""

    max_request_bytes: int = 1 * MiB
    max_depth: int = 64
    max_attachment_bytes: int = 64 * MiB
    attachment_grace_s: float = 300.0
    max_pending_per_sandbox: int = 100


NONE: Mapping[str, Any] = MappingProxyType({})
"""A table broker.toml leaves out: one, shared, that nothing can change."""

DEFAULT_LIMITS = Limits()


class _Fields(NamedTuple):
    """Config's fields (Config itself adds a cache, which a NamedTuple cannot hold)."""

    state_dir: Path
    policy_path: Path | None = None
    limits: Limits = DEFAULT_LIMITS
    integrations: Mapping[str, Mapping[str, Any]] = NONE
    sandbox: Mapping[str, Any] = NONE
    notify: Mapping[str, Any] = NONE
    web: Mapping[str, Any] = NONE
    approvers: Mapping[str, Any] = NONE
    metrics: Mapping[str, Any] | None = (
        None  # [metrics]: on when present (broker.observability.telemetry)
    )
    tracing: Mapping[str, Any] | None = None  # [tracing]: on when present
    audit: Mapping[str, Any] = NONE  # the audit key, checkpoints
    repositories_table: Mapping[str, Any] = NONE  # [repositories.*]
    credentials: Mapping[str, Mapping[str, Any]] = NONE  # minting
    rescan_interval_s: float = 30.0
    preview_timeout_s: float = 30.0  # a handler's assessment or preview, off the loop
    allow_as: bool = False
    source: Path | None = None
    ledger_url: str | None = None  # postgresql://… (shared by a fleet); None: SQLite
    ledger_refs: Mapping[str, Any] = NONE  # ledger_password_env|file
    host_id_setting: str | None = None  # [broker] host_id; else derived, kept in the state dir
    staged: Staged = OFF  # [broker] staged: which effects are staged (broker.staged)
    log_format: str = "text"  # [broker] log_format: text | json (serve's and run's log)


class Config(_Fields):
    """Everything the broker reads from the host before it serves."""

    @property
    def shared_ledger(self) -> bool:
        return self.ledger_url is not None

    def ledger_password(self) -> str | None:
        """The PostgreSQL password, from `ledger_password_env` / `ledger_password_file`."""
        return resolve_secret(self.ledger_refs, "ledger_password", "broker", self.base_dir)

    def host_id(self) -> str:
        """This host's id across the fleet: [broker] host_id, else the one derived once
        (from the machine's name and a random part) and kept in <state>/host_id."""
        if self.host_id_setting is not None:
            return self.host_id_setting
        return fleet.kept_host_id(self.state_dir)

    @property
    def base_dir(self) -> Path | None:
        """Where relative paths in broker.toml start: the file's own folder."""
        return self.source.parent if self.source else None

    @property
    def ledger_path(self) -> Path:
        return self.state_dir / "ledger.sqlite3"

    @property
    def audit_path(self) -> Path:
        return self.state_dir / "audit.jsonl"

    @property
    def sandboxes_dir(self) -> Path:
        return self.state_dir / "sandboxes"

    @functools.cached_property
    def repositories(self) -> Repositories:
        """`[repositories.*]`, with the per-integration protected paths folded in."""
        return parse_repositories(self.repositories_table, self.integrations)

    def integration(self, name: str) -> Settings:
        return Settings(self.integrations.get(name, {}), f"integrations.{name}", self.base_dir)

    def secret(self, integration: str, key: str) -> str | None:
        """Resolve `key_env` / `key_file` under [integrations.<integration>]; a dotted
        key (`remotes.origin.token`) names a nested table. None when neither is set."""
        return self.integration(integration).secret(key)

    def secret_values(self) -> frozenset[str]:
        """Every secret the config references, for redaction of what is written."""
        found: set[str] = set()

        def walk(table: Mapping[str, Any], where: str) -> None:
            for key, value in table.items():
                if isinstance(value, Mapping):
                    walk(value, f"{where}.{key}")
                elif key.endswith(("_env", "_file")) and isinstance(value, str):
                    base = key.rsplit("_", 1)[0]
                    try:
                        secret = resolve_secret(table, base, where, self.base_dir)
                    except ConfigError:
                        continue
                    if secret and len(secret) >= 4:
                        found.update(_secret_parts(secret))
                elif isinstance(value, list):
                    for i, item in enumerate(value):
                        if isinstance(item, Mapping):
                            walk(item, f"{where}.{key}[{i}]")

        walk(self.integrations, "integrations")
        walk(self.credentials, "credentials")
        walk(self.notify, "notify")
        walk(self.web, "web")
        try:
            password = self.ledger_password()
        except ConfigError:
            password = None
        if password and len(password) >= 4:
            found.add(password)
        return frozenset(found)


def _secret_parts(secret: str) -> set[str]:
    """A secret, and for a secret URL (a webhook's) its path and query too: a server
    echoes those alone ("no route for /hook/<secret>")."""
    found = {secret}
    if secret.startswith(("http://", "https://")):
        rest = secret.split("://", 1)[1]
        tail = rest[rest.find("/") :] if "/" in rest else ""
        if len(tail) >= 8:
            found.add(tail)
    return found


def _duration(value: Any, key: str) -> float:
    from broker.clock import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ConfigError(f"broker.{key}: {exc}") from exc


def _positive_int(section: Mapping[str, Any], key: str, default: int) -> int:
    value = section.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"broker.{key}: expected a positive integer, got {value!r}")
    return value


def _table(data: Mapping[str, Any], name: str, path: Path | None) -> Mapping[str, Any] | None:
    value = data.get(name)
    if value is not None and not isinstance(value, Mapping):
        raise ConfigError(f"{path}: [{name}] must be a table")
    return value


def _credentials(
    table: Any, integrations: Mapping[str, Any], path: Path | None
) -> dict[str, dict[str, Any]]:
    """`[credentials.NAME]`: tables with a `kind`, each named by an integration that
    refers to it (`credential = "NAME"`); the provider checks its own keys when used."""
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise ConfigError(f"{path}: [credentials.NAME] must be tables")
    check_no_literal_secrets(table, "credentials")
    for name, spec in table.items():
        if not isinstance(spec.get("kind"), str):
            raise ConfigError(f"credentials.{name}.kind: name the provider (github_app, aws_sts)")
    for integration, settings in integrations.items():
        named = settings.get("credential")
        if named is not None and named not in table:
            raise ConfigError(
                f"integrations.{integration}.credential: no [credentials.{named}] table"
            )
    return table


def _broker_section(data: Mapping[str, Any], path: Path | None) -> dict[str, Any]:
    """[broker], once every section's and key's name is known."""
    unknown = set(data) - {
        *("broker", "integrations", "sandbox", "approvers", "notify", "web"),
        *("metrics", "tracing", "audit", "repositories", "credentials"),
    }
    if unknown:
        raise ConfigError(f"{path}: unknown section [{sorted(unknown)[0]}]")
    section: dict[str, Any] = data.get("broker", {})
    bad = set(section) - BROKER_KEYS
    if bad:
        raise ConfigError(f"{path}: unknown key broker.{sorted(bad)[0]}")
    return section


def _integrations(data: Mapping[str, Any], path: Path | None) -> dict[str, Any]:
    integrations = data.get("integrations", {})
    if not isinstance(integrations, dict) or not all(
        isinstance(v, dict) for v in integrations.values()
    ):
        raise ConfigError(f"{path}: [integrations.NAME] must be tables")
    check_no_literal_secrets(integrations, "integrations")
    return integrations


def load_config(
    path: Path | None = None,
    *,
    state_dir: Path | None = None,
    policy: Path | None = None,
) -> Config:
    """Read broker.toml: `path`, else $BROKER_CONFIG, else <state_dir>/broker.toml."""
    located = locate(path, state_dir, policy)
    path, data = located.path, located.data
    section = _broker_section(data, path)
    integrations = _integrations(data, path)
    credentials = _credentials(data.get("credentials", {}), integrations, path)
    repositories = data.get("repositories", {})
    parse_repositories(repositories, integrations)  # a fault stops the start, naming the key
    return Config(
        state_dir=located.state_dir,
        policy_path=located.policy_path,
        limits=_limits(section),
        integrations=integrations,
        sandbox=_sandbox(data),
        notify=data.get("notify", {}),
        web=data.get("web", {}),
        approvers=data.get("approvers", {}),
        metrics=_table(data, "metrics", path),
        tracing=_table(data, "tracing", path),
        audit=data.get("audit", {}),
        repositories_table=repositories,
        credentials=credentials,
        rescan_interval_s=_duration(section.get("rescan_interval", "30s"), "rescan_interval"),
        preview_timeout_s=_duration(section.get("preview_timeout", "30s"), "preview_timeout"),
        allow_as=bool(section.get("allow_as", False)),
        source=path,
        ledger_url=ledger_url(section),
        ledger_refs={k: v for k, v in section.items() if k.startswith("ledger_password")},
        host_id_setting=fleet.host_id_from(section),
        staged=Staged.parse(section.get("staged", False)),
        log_format=_log_format(section.get("log_format", "text")),
    )


def _sandbox(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """[sandbox], its warm pool's size checked (the other keys are read where used)."""
    section: Mapping[str, Any] = data.get("sandbox", {})
    warm = section.get("warm", 0)
    if not isinstance(warm, int) or isinstance(warm, bool) or warm < 0:
        raise ConfigError(
            f"sandbox.warm: expected a whole number of containers kept ready (0: none), "
            f"got {warm!r}"
        )
    return section


def _log_format(value: Any) -> str:
    if value not in ("text", "json"):
        raise ConfigError(f'broker.log_format: expected "text" or "json", not {value!r}')
    return str(value)


def ledger_url(section: Mapping[str, Any]) -> str | None:
    """[broker] ledger: a postgresql:// URL with no password in it, or absent (SQLite)."""
    from urllib.parse import parse_qs, urlsplit

    url = section.get("ledger")
    if url is None:
        if any(k.startswith("ledger_password") for k in section):
            raise ConfigError(
                "broker.ledger_password_*: goes with broker.store.sqlite = postgresql://…"
            )
        return None
    if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            "broker.store.sqlite: expected a postgresql://user@host:port/dbname URL "
            "(leave it out for the SQLite ledger in the state dir)"
        )
    try:
        parts = urlsplit(url)
        inline = parts.password is not None or "password" in parse_qs(parts.query)
    except ValueError as exc:
        raise ConfigError(f"broker.store.sqlite: not a URL: {exc}") from exc
    if inline:
        raise ConfigError(
            "broker.store.sqlite: secrets are never written in broker.toml; take the password "
            "out of the URL and use ledger_password_env or ledger_password_file"
        )
    return url


def _limits(section: Mapping[str, Any]) -> Limits:
    """[broker]'s bounds on what a sandbox may hand the broker."""
    return Limits(
        max_request_bytes=_positive_int(
            section, "max_request_bytes", DEFAULT_LIMITS.max_request_bytes
        ),
        max_depth=_positive_int(section, "max_depth", DEFAULT_LIMITS.max_depth),
        max_attachment_bytes=_positive_int(
            section, "max_attachment_bytes", DEFAULT_LIMITS.max_attachment_bytes
        ),
        attachment_grace_s=_duration(section.get("attachment_grace", "5m"), "attachment_grace"),
        max_pending_per_sandbox=_positive_int(
            section, "max_pending_per_sandbox", DEFAULT_LIMITS.max_pending_per_sandbox
        ),
    )
