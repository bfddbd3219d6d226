"""Fixtures shared with the sandbox tests: rootful Podman (skipped when absent)."""

from tests.sandbox.conftest import podman_runtime  # noqa: F401  (shared fixture)
