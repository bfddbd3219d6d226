"""Finding 7: no header line can be injected through the subject or a display name,
on the project's minimum Python (3.11, where the email package decodes an encoded word
into a raw CR LF while it writes headers), against a real SMTP server (aiosmtpd)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from broker.errors import InvalidParams
from broker.registry import default_registry
from broker.testing import BrokerHarness, make_context
from broker.validation import Validator
from effects.email.message import Envelope, build_message
from effects.email.settings import settings_from
from tests.effects.netfixtures import (  # noqa: F401  (fixtures, used by their names)
    SMTP,
    fixture_smtp_plain,
)
from tests.support import checked

INJECTIONS = [
    "weekly =?utf-8?q?report=0D=0AX-Injected:_yes?=",
    "weekly =?utf-8?b?cmVwb3J0DQpYLUluamVjdGVkOiB5ZXM=?=",
    "=?iso-8859-1?q?a=0AX-Injected:_yes?=",
    "nul =?utf-8?q?a=00b?=",
]


def email_settings(smtp: SMTP) -> dict[str, Any]:
    controller, _ = smtp
    return {
        "host": "127.0.0.1",
        "port": controller.port,
        "security": "none",
        "from": "Agent <agent@example.com>",
        "allow_domains": ["example.com"],
    }


@pytest.mark.parametrize("subject", INJECTIONS)
def test_encoded_control_characters_in_the_subject_are_invalid(
    tmp_path: Path, smtp_plain: SMTP, subject: str
) -> None:
    """The issue's subject (and its base64 and LF-only cousins) is `invalid`, naming the
    subject; the server receives nothing."""
    assert sys.version_info >= (3, 11)
    policy = '[[rules]]\neffect = "email.send"\naction = "auto"\nreason = "t"\n'
    settings = {"email": email_settings(smtp_plain)}
    with BrokerHarness(tmp_path / "h", integrations=settings, policy=policy) as h:
        params = {"to": ["jane@example.com"], "subject": subject, "text": "hi"}
        result = checked(h.submit(h.request("email.send", params)))
    assert result["status"] == "invalid"
    assert result["errors"][0]["path"] == "/params/subject"
    assert "encoded word" in result["reason"]
    assert smtp_plain[1].messages == []


def test_an_encoded_word_in_a_display_name_is_invalid(tmp_path: Path, smtp_plain: SMTP) -> None:
    """The same trick in `Name <addr>` is refused, naming the recipient."""
    policy = '[[rules]]\neffect = "email.send"\naction = "auto"\nreason = "t"\n'
    settings = {"email": email_settings(smtp_plain)}
    to = ["=?utf-8?q?Jane=0D=0ABcc:_x@evil.test?= <jane@example.com>"]
    with BrokerHarness(tmp_path / "h", integrations=settings, policy=policy) as h:
        result = checked(h.submit(h.request("email.send", {"to": to, "subject": "s", "text": "t"})))
    assert result["status"] == "invalid"
    assert result["errors"][0]["path"] == "/params/to/0"
    assert smtp_plain[1].messages == []


def test_harmless_encoded_words_still_send(tmp_path: Path, smtp_plain: SMTP) -> None:
    """An encoded word that decodes to ordinary text is sent, as one Subject line."""
    policy = '[[rules]]\neffect = "email.send"\naction = "auto"\nreason = "t"\n'
    settings = {"email": email_settings(smtp_plain)}
    with BrokerHarness(tmp_path / "h", integrations=settings, policy=policy) as h:
        params = {"to": ["jane@example.com"], "subject": "=?utf-8?q?caf=C3=A9?= menu", "text": "t"}
        result = checked(h.submit(h.request("email.send", params)))
    assert result["status"] == "applied", result
    (message,) = smtp_plain[1].messages
    headers = message.content.split(b"\r\n\r\n", 1)[0].decode()
    assert [line for line in headers.splitlines() if line.startswith("Subject:")]
    assert "X-Injected" not in headers


def test_the_message_policy_refuses_a_fold_that_injects_a_line(smtp_plain: SMTP) -> None:
    """Past every check (build_message called directly), the strict policy still refuses
    to write the headers rather than send `X-Injected: yes` as a header of its own."""
    settings = settings_from(email_settings(smtp_plain))
    params = {"to": ["jane@example.com"], "subject": INJECTIONS[0], "text": "t"}
    env = Envelope((settings.sender,), (), (), None)

    ctx = make_context(integration="email")
    msg = build_message(params, settings, env, ctx, datetime.now(UTC))
    with pytest.raises(InvalidParams, match="line of its own"):
        msg.as_bytes()


@pytest.mark.parametrize(
    ("effect", "params", "pointer"),
    [
        (
            "email.send",
            {"to": ["a@example.com"], "subject": "hi\n", "text": "t"},
            "/params/subject",
        ),
        ("email.send", {"to": ["a@example.com\n"], "subject": "hi", "text": "t"}, "/params/to/0"),
        ("github.issue.create", {"repo": "acme/api\n", "title": "t"}, "/params/repo"),
        (
            "github.label.add",
            {"repo": "acme/api", "number": 1, "labels": ["bug\n"]},
            "/params/labels/0",
        ),
        (
            "http.request",
            {"method": "GET", "url": "https://a.test/", "headers": {"X-A": "v\n"}},
            "/params/headers/X-A",
        ),
        ("s3.delete_object", {"bucket": "scratch\n", "key": "a"}, "/params/bucket"),
        (
            "git.push",
            {"remote": "origin", "branch": "agent/x\n", "bundle": "b", "expected_old": None},
            "/params/branch",
        ),
        ("webhook.post", {"target": "deploy\n", "payload": {}}, "/params/target"),
    ],
)
def test_every_params_pattern_is_a_full_match(
    effect: str, params: dict[str, Any], pointer: str
) -> None:
    """Python's `$` accepts a trailing newline; every schema pattern refuses it."""
    validator = Validator(default_registry().schemas())
    with pytest.raises(Exception) as caught:
        validator.params(effect, params)
    assert pointer in [i.path for i in caught.value.issues]  # type: ignore[attr-defined]


def test_no_schema_pattern_ends_in_a_bare_dollar() -> None:
    """Each anchored pattern ends `$(?!\\n)`, the full match in Python and in ECMA-262."""
    import json
    import re

    root = Path(__file__).resolve().parents[2] / "schemas"
    patterns = re.findall(
        r'"pattern":\s*"((?:[^"\\]|\\.)*)"', "".join(p.read_text() for p in root.glob("*.json"))
    )
    bare = [json.loads(f'"{p}"') for p in patterns if json.loads(f'"{p}"').endswith("$")]
    assert patterns and bare == []
