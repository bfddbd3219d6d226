"""The edge: S3's error codes and botocore's exceptions become reasons an agent can act on."""

from __future__ import annotations

import string
from typing import Any

import pytest
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
    WaiterError,
)

from broker.errors import EffectFailed
from effects import s3

# -- errors at the edge -------------------------------------------------------------


def _client_error(code: str, status: int = 400) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": "m"},
            "ResponseMetadata": {"HTTPStatusCode": status},  # type: ignore[typeddict-item]
        },
        "PutObject",
    )


def _all_botocore_errors() -> list[type[BotoCoreError]]:
    found: list[type[BotoCoreError]] = []
    todo: list[type[BotoCoreError]] = [BotoCoreError]
    while todo:
        kind = todo.pop()
        found.append(kind)
        todo.extend(kind.__subclasses__())
    return sorted(
        {k for k in found if k.__module__ == "botocore.exceptions"}, key=lambda k: k.__name__
    )


def _botocore_error(kind: type[BotoCoreError]) -> BotoCoreError:
    """An instance of any botocore error, its message fields filled with placeholders."""
    fields = {name for _, name, _, _ in string.Formatter().parse(kind.fmt) if name}
    values: dict[str, Any] = dict.fromkeys(fields, "E")
    if issubclass(kind, WaiterError):
        return kind(name="w", reason="r", last_response={})
    return kind(**values)


OP = s3.Op("writing s3://b/k", "b", "k", write=True, conflict="failed: it changed", endpoint="E")
READ = s3.Op("reading s3://b/k", "b", "k", endpoint="E")
GENERIC = "failed: S3 answered"


class TestErrorMapping:
    @pytest.mark.parametrize("code", sorted(s3.REASONS))
    def test_every_mapped_code_has_its_own_reason(self, code: str) -> None:
        """Each S3 error code the handler knows becomes its own actionable sentence."""
        reason = s3.translate(_client_error(code), OP).reason
        assert reason.startswith("failed:") and not reason.startswith(GENERIC)

    @pytest.mark.parametrize(
        ("status", "code"), [("412", "PreconditionFailed"), ("403", "AccessDenied")]
    )
    def test_bodiless_head_errors_map_by_status(self, status: str, code: str) -> None:
        """A HEAD error (no body, code = status) maps like its named code."""
        assert s3.translate(_client_error(status), OP).reason == (
            s3.translate(_client_error(code), OP).reason
        )

    def test_412_says_the_object_changed(self) -> None:
        """A 412 carries the condition owner's sentence."""
        assert s3.translate(_client_error("PreconditionFailed", 412), OP).reason == (
            "failed: it changed"
        )

    def test_unknown_code_is_named(self) -> None:
        """An unmapped code still reaches the agent as a sentence naming code and status."""
        reason = s3.translate(_client_error("WeirdThing", 418), OP).reason
        assert reason.startswith(GENERIC) and "WeirdThing" in reason and "418" in reason

    @pytest.mark.parametrize(("kind", "_"), s3.botocore_reasons())
    def test_every_mapped_botocore_error_has_its_own_reason(self, kind: type, _: str) -> None:
        """Each botocore error class handled becomes its own sentence, not the catch-all."""
        reason = s3.translate(_botocore_error(kind), READ).reason
        assert reason.startswith("failed:") and "S3 client failed" not in reason

    @pytest.mark.parametrize("kind", _all_botocore_errors(), ids=lambda k: k.__name__)
    def test_every_botocore_error_becomes_a_sentence(self, kind: type[BotoCoreError]) -> None:
        """No botocore error escapes as a traceback: each is a reason naming no secret."""
        for op in (READ, OP):
            failed = s3.translate(_botocore_error(kind), op)
            assert isinstance(failed, EffectFailed) and failed.reason.startswith("failed:")

    @pytest.mark.parametrize("kind", [ReadTimeoutError, ConnectionClosedError])
    def test_a_write_cut_short_says_it_may_have_happened(self, kind: type) -> None:
        """A timeout during a write tells the agent to check before retrying."""
        assert "may or may not have been made" in s3.translate(_botocore_error(kind), OP).reason

    @pytest.mark.parametrize("kind", [ConnectTimeoutError, EndpointConnectionError])
    def test_connection_failures_say_s3_is_unreachable(self, kind: type) -> None:
        """Connect failures name the endpoint that could not be reached."""
        assert "cannot reach S3 at E" in s3.translate(_botocore_error(kind), OP).reason
