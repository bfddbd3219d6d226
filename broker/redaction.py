"""Secrets never reach what the broker writes: the ledger, results, the audit log.

Every value the config references as a secret is masked wherever it appears in a
string, key or value, before it is written. Longer secrets first, so a secret that
contains a shorter one is masked whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MASK = "•••"


class Redactor:
    """Masks a fixed set of secret values in any JSON-like value."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def __call__(self, value: Any) -> Any:
        if not self._secrets or value is None:
            return value
        return self._walk(value)

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            for secret in self._secrets:
                if secret in value:
                    value = value.replace(secret, MASK)
            return value
        if isinstance(value, dict):
            return {self._walk(k): self._walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v) for v in value]
        return value
