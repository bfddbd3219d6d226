"""Aliases the contracts use. The handler contract itself is `effects.base`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JSON = dict[str, Any]
"""What a handler returns: a JSON-able object."""

Params = Mapping[str, Any]
"""A request's params, validated against the effect's schema, read-only by convention."""
