"""The audit log's key and its signed checkpoints, exported off the state dir.

    [audit]
    key_file = "/etc/broker/audit.key"       # or key_env; never inside the state dir
    checkpoint_file = "/var/log/broker/audit-checkpoints.jsonl"
    checkpoint_syslog = "/dev/log"           # a Unix socket path, or "host:port" (UDP)
    checkpoint_webhook_env = "AUDIT_HOOK"    # or checkpoint_webhook_file / checkpoint_webhook
    checkpoint_every = 100                   # events between checkpoints (and at every stop)
    checkpoint_interval = "5m"               # ...or this long, whichever comes first

The key (at least 16 characters, e.g. `openssl rand -hex 32`) keys the hash chain
(broker.audit.log) and signs every checkpoint: `{"checkpoint": 1, "seq", "hash", "at",
"mac"}`, the HMAC-SHA256 of the rest under the key. A checkpoint names the chain's head
at a moment; kept where the state dir's writers cannot reach (another host's log, a
webhook), it lets `broker audit verify --checkpoints FILE` prove that the log still
holds that head: a re-sealed chain or a log cut short no longer does. Exporting never
stops the broker: a failure is logged and the next checkpoint tries again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import logging.handlers
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker import clock
from broker.audit.log import AuditLog
from broker.audit.verify import Fault
from broker.clock import REAL, Clock
from broker.config import Config
from broker.errors import ConfigError
from broker.models import canonical_json
from broker.settings import only_keys, resolve_secret

log = logging.getLogger("broker.audit.log")
KEYS = {
    "key_env",
    "key_file",
    "checkpoint_file",
    "checkpoint_syslog",
    "checkpoint_webhook",
    "checkpoint_webhook_env",
    "checkpoint_webhook_file",
    "checkpoint_every",
    "checkpoint_interval",
}
MIN_KEY = 16


@dataclass(frozen=True)
class AuditSettings:
    """[audit], checked, its secrets resolved."""

    key: bytes | None = None
    file: Path | None = None
    syslog: str | None = None
    webhook: str | None = None
    every: int = 100
    interval_s: float = 300.0

    @property
    def exports(self) -> bool:
        return bool(self.file or self.syslog or self.webhook)


def audit_settings(config: Config) -> AuditSettings:
    """Read [audit]; a fault names the key."""
    table: Mapping[str, Any] = config.audit
    only_keys("audit", table, KEYS)
    key = _key(table, config)
    every = table.get("checkpoint_every", 100)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ConfigError("audit.checkpoint_every: a whole number of events, at least 1")
    try:
        interval = clock.parse_duration(table.get("checkpoint_interval", "5m"))
    except ValueError as exc:
        raise ConfigError(f"audit.checkpoint_interval: {exc}") from exc
    webhook = table.get("checkpoint_webhook") or resolve_secret(
        table, "checkpoint_webhook", "audit", config.base_dir
    )
    file = table.get("checkpoint_file")
    found = AuditSettings(
        key=key,
        file=_outside(config, file, "checkpoint_file") if file else None,
        syslog=_string(table, "checkpoint_syslog"),
        webhook=webhook if isinstance(webhook, str) and webhook else None,
        every=every,
        interval_s=interval,
    )
    if found.exports and key is None:
        raise ConfigError(
            "audit.key_file: checkpoints are signed with the audit key; set key_env or key_file"
        )
    if found.webhook and not found.webhook.startswith(("http://", "https://")):
        raise ConfigError("audit.checkpoint_webhook: an http(s) URL is required")
    return found


def _key(table: Mapping[str, Any], config: Config) -> bytes | None:
    if "key_file" in table:
        _outside(config, str(table["key_file"]), "key_file")
    value = resolve_secret(table, "key", "audit", config.base_dir)
    if value is None:
        return None
    if len(value) < MIN_KEY:
        raise ConfigError(f"audit.key: at least {MIN_KEY} characters (openssl rand -hex 32)")
    return value.encode("utf-8")


def _outside(config: Config, name: str, key: str) -> Path:
    """A path that is not inside the state dir, whose writers must not reach it."""
    path = Path(name)
    if config.base_dir is not None and not path.is_absolute():
        path = config.base_dir / path
    resolved, state = path.resolve(), config.state_dir.resolve()
    if resolved == state or state in resolved.parents:
        raise ConfigError(
            f"audit.{key}: {name} is inside the state dir, where whoever can rewrite the "
            "log could rewrite it too; keep it elsewhere"
        )
    return path


def _string(table: Mapping[str, Any], key: str) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"audit.{key}: expected a string")
    return value


def audit_log(config: Config) -> AuditLog:
    """The state dir's audit log, keyed when the host configures a key."""
    return AuditLog(config.audit_path, audit_settings(config).key)


# -- checkpoints -------------------------------------------------------------------------


def signed(key: bytes, seq: int, head: str, at: str) -> dict[str, Any]:
    """A checkpoint of the chain's head `head` at event `seq`, signed with `key`."""
    body: dict[str, Any] = {"checkpoint": 1, "seq": seq, "hash": head, "at": at}
    return {**body, "mac": _mac(key, body)}


def _mac(key: bytes, body: Mapping[str, Any]) -> str:
    return hmac.new(key, canonical_json(dict(body)), hashlib.sha256).hexdigest()


class Checkpoints:
    """Exports a signed checkpoint every `every` events or `interval_s` seconds (and at a
    stop) to each configured sink; never raises."""

    def __init__(self, settings: AuditSettings, clock: Clock = REAL) -> None:
        self.settings = settings
        self.clock = clock
        self._last_seq = 0
        self._last_at = clock.monotonic()
        self._lock = threading.Lock()

    def __call__(self, seq: int, head: str, final: bool) -> None:
        key = self.settings.key
        if key is None or not self.settings.exports or seq <= self._last_seq:
            return
        due = seq - self._last_seq >= self.settings.every
        due = due or self.clock.monotonic() - self._last_at >= self.settings.interval_s
        if not (final or due):
            return
        stamp = clock.iso(self.clock.now())
        assert stamp is not None
        point = signed(key, seq, head, stamp)
        with self._lock:
            self._last_seq, self._last_at = seq, self.clock.monotonic()
            for name, sink in (
                ("file", self._file),
                ("syslog", self._syslog),
                ("webhook", self._hook),
            ):
                try:
                    sink(point)
                except Exception as exc:  # an observer never breaks the loop
                    log.warning("audit checkpoint %d not exported to %s: %s", seq, name, exc)

    def _file(self, point: dict[str, Any]) -> None:
        if self.settings.file is None:
            return
        fd = os.open(
            self.settings.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            os.write(fd, json.dumps(point, sort_keys=True).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def _syslog(self, point: dict[str, Any]) -> None:
        where = self.settings.syslog
        if where is None:
            return
        address: str | tuple[str, int] = where
        if not where.startswith("/") and ":" in where:
            host, _, port = where.rpartition(":")
            address = (host, int(port))
        handler = logging.handlers.SysLogHandler(
            address=address, facility=logging.handlers.SysLogHandler.LOG_AUTHPRIV
        )
        try:
            record = logging.LogRecord(
                "broker.audit.log",
                logging.INFO,
                __file__,
                0,
                "broker-audit: %s",
                (json.dumps(point, sort_keys=True),),
                None,
            )
            handler.emit(record)
        finally:
            handler.close()

    def _hook(self, point: dict[str, Any]) -> None:
        if self.settings.webhook is None:
            return
        import httpx

        from broker.masking import quiet_http_libraries

        quiet_http_libraries()
        with httpx.Client(timeout=5.0, follow_redirects=False, trust_env=False) as http:
            http.post(self.settings.webhook, json=point).raise_for_status()


def checkpoints_for(config: Config, clock: Clock = REAL) -> Checkpoints | None:
    settings = audit_settings(config)
    return Checkpoints(settings, clock) if settings.exports else None


# -- reading them back -------------------------------------------------------------------


def read_checkpoints(path: Path) -> list[tuple[int, dict[str, Any] | None]]:
    """(line number, checkpoint or None) for each line holding one: a JSON object with a
    `checkpoint` key, alone or after a syslog prefix."""
    found: list[tuple[int, dict[str, Any] | None]] = []
    with path.open("r", encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            start, end = line.find("{"), line.rfind("}")
            if start < 0 or '"checkpoint"' not in line:
                continue
            try:
                value = json.loads(line[start : end + 1])
            except ValueError:
                found.append((number, None))
                continue
            found.append((number, value if isinstance(value, dict) else None))
    return found


def check_checkpoints(
    points: list[tuple[int, dict[str, Any] | None]], hashes: Mapping[int, str], key: bytes
) -> Fault | None:
    """The first checkpoint that is not signed by `key` or not in the chain (`hashes`:
    seq -> hash, from `broker.audit.log.check`); a Fault whose line is the checkpoint's."""
    for number, point in points:
        if point is None or not {"seq", "hash", "mac"} <= set(point):
            return Fault(number, "the checkpoints file: this line is not a checkpoint")
        body = {k: v for k, v in point.items() if k != "mac"}
        if not hmac.compare_digest(str(point["mac"]), _mac(key, body)):
            return Fault(
                number, "the checkpoints file: this checkpoint is not signed by the audit key"
            )
        seq, head = point["seq"], point["hash"]
        if hashes.get(seq) != head:
            what = "holds another line there" if seq in hashes else "ends before it"
            return Fault(
                number,
                f"checkpoint of event {seq} (exported at {point.get('at')}): the log {what}, "
                "so it was rewritten (re-sealed) or cut short since",
            )
    return None
