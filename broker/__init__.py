"""Sandbox-outbox effect broker: gate what leaves the sandbox, not what runs in it."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
