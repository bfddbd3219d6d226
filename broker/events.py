"""What wakes the broker's loop: frozen events on one queue.

The watcher puts FileSeen, DirsChanged and Rescan; workers put the outcome of work
done off the loop (Applied); other threads put Wake or a Control request. Events are
hints: the loop re-reads the ledger and the directories before acting on any.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.errors import EffectFailed
from broker.models import State

Key = tuple[str, str]
"""A request's (sandbox, id)."""


@dataclass(frozen=True, slots=True)
class FileSeen:
    """An entry in an outbox that may be worth reading."""

    folder: str
    name: str


@dataclass(frozen=True, slots=True)
class DirsChanged:
    """A watched parent changed (the sandboxes root, the control dir, a new sandbox)."""


@dataclass(frozen=True, slots=True)
class Rescan:
    """Events may have been lost: converge on the directories' and the ledger's contents."""


@dataclass(frozen=True, slots=True)
class Reload:
    """Another process committed a change to this host's requests (a decision taken on
    any host of a shared store): reload them from the ledger."""


@dataclass(frozen=True, slots=True)
class Wake:
    """Look at the stop flag (or a nudge) now rather than at the next timeout."""


@dataclass(frozen=True, slots=True)
class Applied:
    """A handler's apply came back from a worker."""

    key: Key
    status: State  # applied | failed | invalid
    reason: str | None = None
    output: dict[str, Any] | None = None
    issues: list[dict[str, str]] = field(default_factory=list)
    credential: list[dict[str, Any]] | None = None  # what was minted for it (its scopes)


@dataclass(frozen=True, slots=True)
class Assessed:
    """Work done off the loop for a held request came back: its reversibility (when it
    was not known), its preview (when people must decide), and what the handler
    remembered. `refused` is the handler's own answer (an EffectFailed: the request
    fails with it); `broken` says why the work could not be done (a crash, a timeout):
    the request is then treated as irreversible, never applied on a guess."""

    key: Key
    sha256: str
    reversible: bool | None = None
    preview: dict[str, Any] | None = None
    seen: dict[str, Any] | None = None
    protected: tuple[str, ...] = ()  # the protected paths the change touches
    refused: EffectFailed | None = None
    broken: str | None = None


@dataclass(frozen=True, slots=True)
class Control:
    """A request from another process on this host, through the control socket."""

    op: str  # serve | release
    sandbox: str
    reply: Callable[[dict[str, Any]], None]
    connection: Any = None  # the client's connection, for the events it follows


Event = FileSeen | DirsChanged | Rescan | Reload | Wake | Applied | Assessed | Control
