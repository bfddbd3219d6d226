"""What one wake-up must do once its transaction has committed (the after-commit I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.intake.outbox import Outbox
from broker.models import Record


@dataclass
class Batch:
    """Filled by the stages inside the transaction, done by the loop after the commit:
    nothing observable (a removed file, a result, an audit line, a handler call) may
    happen before the state it follows from is committed."""

    remove: list[tuple[Outbox, str]] = field(default_factory=list)  # claimed names
    urgent: set[str] = field(default_factory=set)  # claimed names to remove at once
    answer: list[Record] = field(default_factory=list)  # result files to write
    apply: list[Record] = field(default_factory=list)  # to hand to the workers
    inline: list[Record] = field(default_factory=list)  # to apply inside this commit
    assess: list[Record] = field(default_factory=list)  # held: assess or preview off the loop
    deadlines: list[Record] = field(default_factory=list)  # pending: watch their deadline
    settled: list[Record] = field(default_factory=list)  # done applying: drop start marks
    withdrawn: list[tuple[Outbox, str]] = field(default_factory=list)  # withdrawal files

    def mark(self) -> tuple[int, ...]:
        return tuple(len(getattr(self, name)) for name in _LISTS)

    def rollback(self, mark: tuple[int, ...]) -> None:
        """Forget what was added since `mark` (its savepoint was rolled back)."""
        for name, length in zip(_LISTS, mark, strict=True):
            del getattr(self, name)[length:]


_LISTS = ("remove", "answer", "apply", "inline", "assess", "deadlines", "settled", "withdrawn")
