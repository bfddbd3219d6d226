"""email.send against a real SMTP server (aiosmtpd) on 127.0.0.1: what arrives (headers,
body, envelope), the recipient allowlist, STARTTLS and implicit TLS with a login, and
failures that read as sentences without the password."""

from __future__ import annotations

import email
import email.policy
import inspect
import smtplib
import socket
import ssl
from email.message import EmailMessage
from typing import Any

import pytest
from jsonschema import Draft202012Validator, ValidationError

from broker.errors import ConfigError, EffectFailed, InvalidParams
from effects.email import EmailSend, message_id, settings_from, smtp_failure
from tests.effects.netfixtures import (  # noqa: F401  (fixtures, used by their names)
    SMTP,
    SMTP_PASSWORD,
    MakeContext,
    fixture_ca,
    fixture_ca_file,
    fixture_loopback_only,
    fixture_make_ctx,
    fixture_smtp_plain,
    fixture_smtp_ssl,
    fixture_smtp_starttls,
    free_port,
    run,
)


def config(controller: Any, **extra: Any) -> dict[str, Any]:
    """[integrations.email] for a local server; plain unless `extra` says otherwise."""
    return {
        "host": "127.0.0.1",
        "port": controller.port,
        "security": "none",
        "from": "Build Agent <agent@example.com>",
        "allow_domains": ["example.com", "*.example.org"],
        "helo": "broker.test",
        "timeout": "5s",
        **extra,
    }


@pytest.fixture
def smtp_password(monkeypatch: pytest.MonkeyPatch) -> str:
    """The SMTP password, in the host's environment only."""
    monkeypatch.setenv("SMTP_PASSWORD", SMTP_PASSWORD)
    return SMTP_PASSWORD


def received(inbox_message: Any) -> EmailMessage:
    message = email.message_from_bytes(inbox_message.content, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return message


PARAMS: dict[str, Any] = {
    "to": ["Jane Doe <jane@example.com>"],
    "cc": ["ops@lists.example.org"],
    "bcc": ["audit@example.com"],
    "reply_to": "team@example.com",
    "subject": "Nightly build: 3 failures",
    "text": "Three tests failed.\nSee the log.\n",
}


def test_message_arrives_with_headers_body_and_envelope(
    smtp_plain: SMTP, make_ctx: MakeContext
) -> None:
    """Headers, Message-ID and body arrive; Bcc only in the envelope; output lists who got it."""
    controller, inbox = smtp_plain
    ctx = make_ctx(config(controller))
    out = run(EmailSend(), PARAMS, ctx)
    (envelope,) = inbox.messages
    assert envelope.mail_from == "agent@example.com"
    assert envelope.rcpt_tos == ["jane@example.com", "ops@lists.example.org", "audit@example.com"]
    msg = received(envelope)
    assert msg["From"] == "Build Agent <agent@example.com>"
    assert msg["To"] == "Jane Doe <jane@example.com>"
    assert msg["Cc"] == "ops@lists.example.org"
    assert msg["Reply-To"] == "team@example.com"
    assert msg["Subject"] == "Nightly build: 3 failures"
    assert msg["Bcc"] is None
    assert (
        msg["Message-ID"]
        == out["message_id"]
        == message_id(ctx, settings_from(ctx.settings).sender)
    )
    assert msg.get_content().replace("\r\n", "\n") == "Three tests failed.\nSee the log.\n"
    assert out["accepted"] == envelope.rcpt_tos and out["refused"] == {}


def test_text_and_html_make_an_alternative_message(smtp_plain: SMTP, make_ctx: MakeContext) -> None:
    """Both bodies arrive as multipart/alternative, non-ASCII text intact."""
    controller, inbox = smtp_plain
    params = {
        "to": ["jane@example.com"],
        "subject": "Grüße",
        "text": "Hallo Zoë",
        "html": "<p>Hallo</p>",
    }
    run(EmailSend(), params, make_ctx(config(controller)))
    msg = received(inbox.messages[0])
    assert msg.get_content_type() == "multipart/alternative"
    assert msg["Subject"] == "Grüße"
    plain = msg.get_body(("plain",))
    html = msg.get_body(("html",))
    assert plain is not None and plain.get_content().strip() == "Hallo Zoë"
    assert html is not None and html.get_content().strip() == "<p>Hallo</p>"


def test_message_id_recognises_a_retry_of_the_same_request(make_ctx: MakeContext) -> None:
    """The same request yields the same Message-ID; another request id a different one."""
    sender = settings_from(config(type("C", (), {"port": 25}))).sender
    first = message_id(make_ctx({}), sender)
    assert message_id(make_ctx({}), sender) == first
    assert message_id(make_ctx({}, request_id="req-2"), sender) != first
    assert first.startswith("<broker.") and first.endswith("@example.com>")


@pytest.mark.parametrize(
    ("field", "address"),
    [("to", "someone@gmail.com"), ("cc", "x@example.org"), ("bcc", "spy@evil.test")],
)
def test_recipient_outside_the_allowlist_is_invalid_and_nothing_is_sent(
    field: str, address: str, smtp_plain: SMTP, make_ctx: MakeContext
) -> None:
    """Any recipient whose domain is not allowed makes the request invalid, naming it."""
    controller, inbox = smtp_plain
    params = {**PARAMS, field: [*PARAMS.get(field, []), address]}
    with pytest.raises(InvalidParams) as caught:
        run(EmailSend(), params, make_ctx(config(controller)))
    assert address.split("@")[1] in caught.value.reason and "not allowed" in caught.value.reason
    assert caught.value.issues[0].path.startswith(f"/params/{field}/")
    assert inbox.messages == []


@pytest.mark.parametrize(
    "address",
    ["jane", "jane@", "a@b@example.com", "x@[127.0.0.1]", "Jane <jane@example.com", "<>"],
)
def test_malformed_addresses_are_invalid(address: str, make_ctx: MakeContext) -> None:
    """Anything but addr@domain or Name <addr@domain> is refused with the address quoted."""
    params = {"to": [address], "subject": "s", "text": "t"}
    with pytest.raises(InvalidParams, match="is not an address"):
        EmailSend().check(params, make_ctx(config(type("C", (), {"port": 25}))))


def test_a_message_needs_a_body(make_ctx: MakeContext) -> None:
    """Neither text nor html: invalid, with a sentence saying what to add."""
    params = {"to": ["jane@example.com"], "subject": "s"}
    with pytest.raises(InvalidParams, match="give text, html or both"):
        run(EmailSend(), params, make_ctx(config(type("C", (), {"port": 25}))))


def test_header_injection_in_the_subject_is_refused_by_the_schema() -> None:
    """A subject with a line break never reaches the handler."""
    schema = Draft202012Validator(EmailSend().schema)
    with pytest.raises(ValidationError):
        schema.validate({"to": ["a@example.com"], "subject": "hi\r\nBcc: x@evil.test", "text": "t"})


def test_starttls_and_login_with_the_password_from_the_environment(
    smtp_starttls: SMTP, smtp_password: str, ca_file: str, make_ctx: MakeContext
) -> None:
    """A server that demands STARTTLS and a login gets both, and accepts the message."""
    controller, inbox = smtp_starttls
    settings = config(
        controller,
        security="starttls",
        username="agent",
        password_env="SMTP_PASSWORD",
        ca_file=ca_file,
    )
    out = run(
        EmailSend(), {"to": ["jane@example.com"], "subject": "s", "text": "t"}, make_ctx(settings)
    )
    assert inbox.logins == [("agent", SMTP_PASSWORD)]
    assert len(inbox.messages) == 1 and out["accepted"] == ["jane@example.com"]
    assert SMTP_PASSWORD not in repr(out)


def test_implicit_tls_with_login(
    smtp_ssl: SMTP, smtp_password: str, ca_file: str, make_ctx: MakeContext
) -> None:
    """security = "ssl" speaks TLS from the first byte and logs in."""
    controller, inbox = smtp_ssl
    settings = config(
        controller, security="ssl", username="agent", password_env="SMTP_PASSWORD", ca_file=ca_file
    )
    run(EmailSend(), {"to": ["jane@example.com"], "subject": "s", "text": "t"}, make_ctx(settings))
    assert inbox.logins == [("agent", SMTP_PASSWORD)]
    assert len(inbox.messages) == 1


def test_untrusted_server_certificate_fails_with_a_reason(
    smtp_starttls: SMTP, smtp_password: str, make_ctx: MakeContext
) -> None:
    """Without the CA, STARTTLS stops at certificate verification and nothing is sent."""
    controller, inbox = smtp_starttls
    settings = config(
        controller, security="starttls", username="agent", password_env="SMTP_PASSWORD"
    )
    with pytest.raises(EffectFailed, match="certificate could not be verified"):
        run(
            EmailSend(),
            {"to": ["jane@example.com"], "subject": "s", "text": "t"},
            make_ctx(settings),
        )
    assert inbox.messages == [] and inbox.logins == []


def test_wrong_password_fails_without_showing_it(
    smtp_starttls: SMTP, ca_file: str, monkeypatch: pytest.MonkeyPatch, make_ctx: MakeContext
) -> None:
    """A refused login reads 'refused the broker's login … tell the operator', sans password."""
    controller, inbox = smtp_starttls
    monkeypatch.setenv("SMTP_PASSWORD", "wrong-password-77")
    settings = config(
        controller,
        security="starttls",
        username="agent",
        password_env="SMTP_PASSWORD",
        ca_file=ca_file,
    )
    with pytest.raises(EffectFailed, match="refused the broker's login") as caught:
        run(
            EmailSend(),
            {"to": ["jane@example.com"], "subject": "s", "text": "t"},
            make_ctx(settings),
        )
    assert "wrong-password-77" not in caught.value.reason
    assert inbox.messages == []


def test_some_recipients_refused_is_reported(smtp_plain: SMTP, make_ctx: MakeContext) -> None:
    """When the server refuses one recipient, the rest get it and the output names the refusal."""
    controller, inbox = smtp_plain
    params = {"to": ["jane@example.com", "nobody@example.com"], "subject": "s", "text": "t"}
    out = run(EmailSend(), params, make_ctx(config(controller)))
    assert out["accepted"] == ["jane@example.com"]
    assert out["refused"] == {"nobody@example.com": "550 5.1.1 no such user here"}
    assert inbox.messages[0].rcpt_tos == ["jane@example.com"]


def test_every_recipient_refused_fails(smtp_plain: SMTP, make_ctx: MakeContext) -> None:
    """When the server refuses everyone, the request fails and says who and why."""
    controller, inbox = smtp_plain
    params = {"to": ["nobody@example.com"], "subject": "s", "text": "t"}
    with pytest.raises(EffectFailed, match=r"refused every recipient.*nobody@example\.com: 550"):
        run(EmailSend(), params, make_ctx(config(controller)))
    assert inbox.messages == []


def test_closed_port_fails_with_a_reason(make_ctx: MakeContext) -> None:
    """Nothing listening on the configured port: 'refused the connection; try again later'."""
    settings = config(type("C", (), {"port": free_port()}))
    with pytest.raises(EffectFailed, match="refused the connection"):
        run(
            EmailSend(),
            {"to": ["jane@example.com"], "subject": "s", "text": "t"},
            make_ctx(settings),
        )


def test_preview_is_the_full_message(smtp_plain: SMTP, make_ctx: MakeContext) -> None:
    """A person sees every header and the body as sent, the Bcc recipients and the server."""
    controller, _ = smtp_plain
    preview = EmailSend().preview(PARAMS, make_ctx(config(controller)))
    facts = dict(preview.facts)
    for line in (
        "From: Build Agent <agent@example.com>",
        "To: Jane Doe <jane@example.com>",
        "Cc: ops@lists.example.org",
        "Reply-To: team@example.com",
        "Subject: Nightly build: 3 failures",
        "Message-ID: <broker.",
        "Three tests failed.\nSee the log.\n",
    ):
        assert line in preview.body
    assert "audit@example.com" not in preview.body
    assert facts["bcc (envelope only, not in the headers)"] == "audit@example.com"
    assert facts["server"] == f"127.0.0.1:{controller.port} (none)"


def test_flags_say_an_email_cannot_be_unsent() -> None:
    """Not reversible, not idempotent, and the undo note says so."""
    handler = EmailSend()
    assert handler.reversible is False and handler.idempotent is False
    assert handler.undo == "an email cannot be unsent"


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"security": "none", "username": "a", "password_env": "SMTP_PASSWORD"},
         "integrations.email.security"),
        ({"allow_domains": []}, "integrations.email.allow_domains"),
        ({"from": "not an address"}, "integrations.email.from"),
        ({"security": "tls"}, "integrations.email.security"),
        ({"port": 0}, "integrations.email.port"),
        ({"password": "literal"}, "integrations.email.password"),
        ({"security": "starttls", "password_env": "SMTP_PASSWORD"}, "integrations.email.username"),
        ({"password_env": "NO_SUCH_VAR_42", "security": "ssl", "username": "a"},
         "integrations.email.password_env"),
    ],
)  # fmt: skip
def test_broken_configuration_stops_the_start_naming_the_key(
    change: dict[str, Any], key: str, smtp_password: str
) -> None:
    """check_config refuses plaintext passwords, missing allowlists, bad senders and ports."""
    settings = {**config(type("C", (), {"port": 25})), **change}
    with pytest.raises(ConfigError) as caught:
        EmailSend().check_config(settings)
    assert str(caught.value).startswith(key)


def _smtplib_exceptions() -> list[type[BaseException]]:
    return [
        obj
        for _, obj in inspect.getmembers(smtplib, inspect.isclass)
        if issubclass(obj, smtplib.SMTPException)
    ]


def _instance(exc_type: type[BaseException]) -> BaseException:
    if issubclass(exc_type, smtplib.SMTPRecipientsRefused):
        return exc_type({"a@example.com": (550, b"no")})
    if issubclass(exc_type, smtplib.SMTPSenderRefused):
        return exc_type(553, b"no", "agent@example.com")
    if issubclass(exc_type, smtplib.SMTPResponseException):
        return exc_type(554, b"no")
    return exc_type("went wrong")


OS_ERRORS: list[BaseException] = [
    ConnectionRefusedError(111, "Connection refused"),
    ConnectionResetError(104, "Connection reset by peer"),
    TimeoutError("timed out"),
    socket.gaierror(-2, "Name or service not known"),
    ssl.SSLCertVerificationError(1, "certificate verify failed"),
    ssl.SSLError(1, "wrong version number"),
    OSError(113, "No route to host"),
]


@pytest.mark.parametrize(
    "exc",
    [_instance(t) for t in _smtplib_exceptions()] + OS_ERRORS,
    ids=lambda e: type(e).__name__,
)
def test_every_smtp_and_socket_error_becomes_a_sentence(exc: BaseException) -> None:
    """Every smtplib and socket error becomes its own sentence naming the server."""
    settings = settings_from({**config(type("C", (), {"port": 2525})), "allow_domains": ["*"]})
    failure = smtp_failure(exc, settings)
    assert isinstance(failure, EffectFailed) and failure.status == "failed"
    assert failure.reason.startswith("failed: ") and "127.0.0.1" in failure.reason
    generic = smtp_failure(smtplib.SMTPException("x"), settings).reason
    if type(exc) is not smtplib.SMTPException:
        assert failure.reason.split("(")[0] != generic.split("(")[0], type(exc).__name__
