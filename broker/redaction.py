"""Secrets never reach what the broker writes: the ledger, results, the audit log.

Every value the config references as a secret is masked wherever it appears in a
string, key or value, before it is written, in every form a service could echo it in
(raw, base64 at any offset, URL-encoded, JSON-escaped, hex, a prefix cut off at the
end): see `broker.masking`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.masking import MASK, Masker

__all__ = ["MASK", "Redactor"]


class Redactor:
    """Masks a fixed set of secret values in any JSON-like value."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = frozenset(s for s in secrets if s)
        self._masker = Masker(self.secrets)

    def __call__(self, value: Any) -> Any:
        return self._masker(value)

    def text(self, value: str) -> str:
        return self._masker.text(value)
