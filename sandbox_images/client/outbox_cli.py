"""The ``outbox`` command: the in-sandbox client (``outbox.py``) from a shell.

    outbox request files.write --param path=notes.txt --param content=hi [--id ID]
    outbox result ID [--wait]
    outbox withdraw ID [--reason TEXT]
    outbox effects [EFFECT] [--json]
    outbox mcp

Standard library only, Python 3.8 or newer, like ``outbox.py`` beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from outbox import OutboxError, catalogue, request, result, wait_for, withdraw

__all__ = ["main"]


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, as promised in --help
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="outbox",
        description="Ask the host for an effect through the outbox, and read its results.",
        epilog="Exit status: 0 if the result is 'applied', 1 for any other result, "
        "2 for a usage error, a timeout or an outbox that cannot be used.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    req = commands.add_parser("request", help="write a request and print its result")
    req.add_argument("effect", metavar="EFFECT", help="e.g. files.write")
    req.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a string parameter (repeatable)",
    )
    req.add_argument(
        "--param-json",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a parameter given as JSON: a number, true, a list, an object",
    )
    req.add_argument(
        "--param-file",
        action="append",
        default=[],
        metavar="KEY=PATH",
        help="a string parameter read from a UTF-8 file ('-' for stdin)",
    )
    req.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="send a file's bytes as an attachment named NAME",
    )
    req.add_argument("--reason", help="why you want this; shown to the people who decide")
    req.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="repeat a request safely: the same key gets the first result",
    )
    req.add_argument(
        "--wait",
        dest="wait",
        action="store_true",
        default=True,
        help="wait for a terminal result (the default)",
    )
    req.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="print the request as written and exit 0",
    )
    req.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help="give up waiting after this long (default: wait forever)",
    )
    req.add_argument(
        "--id",
        dest="request_id",
        metavar="ID",
        help="the request's id: the same command with the same --id is a retry, "
        "never a second request",
    )
    req.add_argument(
        "--quiet", "-q", action="store_true", help="no progress lines on stderr while waiting"
    )

    res = commands.add_parser("result", help="print the current result of a request")
    res.add_argument("id", metavar="ID")
    res.add_argument("--wait", action="store_true", help="wait until it is terminal")
    res.add_argument("--timeout", type=_seconds, metavar="SECONDS")
    res.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")

    wd = commands.add_parser(
        "withdraw", help="take back a request: denied if it still waits for a person"
    )
    wd.add_argument("id", metavar="ID")
    wd.add_argument("--reason", help="why (the audit log and the result say it)")

    eff = commands.add_parser("effects", help="list the effects the broker offers here")
    eff.add_argument("name", nargs="?", metavar="EFFECT", help="show one effect in full")
    eff.add_argument("--json", action="store_true", help="print the catalogue as JSON")

    mcp = commands.add_parser("mcp", help="serve the effects as MCP tools over stdio")
    mcp.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help="give up waiting for a tool call's result after this long (default: never)",
    )
    mcp.add_argument(
        "--portable-names",
        action="store_true",
        help="name tools [A-Za-z0-9_-]{1,64} as OpenAI's API requires: git.push is git-push",
    )
    return parser


def _effects(args: argparse.Namespace) -> int:
    effects = catalogue(timeout=5.0)["effects"]
    if args.name is not None:
        found = [e for e in effects if e.get("name") == args.name]
        if not found:
            raise _UsageError(f"no effect named {args.name!r}; `outbox effects` lists them")
        effects = found
    if args.json or args.name is not None:
        print(json.dumps(effects if args.name is None else effects[0], indent=2))
        return 0
    for e in effects:
        flags = "reversible" if e.get("reversible") else "irreversible"
        if e.get("idempotent"):
            flags += ", idempotent"
        print(f"{e.get('name')}  ({flags})")
        print(f"    {e.get('description', '')}")
        print(f"    approval: {e.get('approval', {}).get('summary', '?')}")
        for target, what in (e.get("returns") or {}).items():
            print(f"    returns, {target}: {what}")
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"timeout must be >= 0, not {text}")
    return value


def _split(option: str, item: str) -> list[str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise _UsageError(f"{option} expects KEY=VALUE, got {item!r}")
    return [key, value]


def _read_file(option: str, path: str) -> bytes:
    try:
        if path == "-":
            return sys.stdin.buffer.read()
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise _UsageError(f"{option}: cannot read {path}: {exc.strerror or exc}") from exc


def _params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {}

    def put(option: str, key: str, value: Any) -> None:
        if key in params:
            raise _UsageError(f"parameter {key!r} is given twice")
        params[key] = value

    for item in args.param:
        key, value = _split("--param", item)
        put("--param", key, value)
    for item in args.param_json:
        key, text = _split("--param-json", item)
        try:
            put("--param-json", key, json.loads(text))
        except ValueError as exc:
            raise _UsageError(f"--param-json {key}: not valid JSON: {exc}") from None
    for item in args.param_file:
        key, path = _split("--param-file", item)
        try:
            put("--param-file", key, _read_file("--param-file", path).decode("utf-8"))
        except UnicodeDecodeError:
            raise _UsageError(
                f"--param-file {key}: {path} is not UTF-8 text; use --attach"
            ) from None
    return params


def _run(args: argparse.Namespace) -> int:
    if args.command == "effects":
        return _effects(args)
    if args.command == "mcp":
        import outbox_mcp

        return outbox_mcp.serve(timeout=args.timeout, portable=args.portable_names)
    if args.command == "withdraw":
        return _withdraw(args.id, args.reason)
    if args.command == "result":
        if args.wait:
            answer = wait_for(args.id, timeout=args.timeout, progress=not args.quiet)
        else:
            found = result(args.id)
            if found is None:
                raise _UsageError(f"no result for request {args.id} yet")
            answer = found
    else:
        attachments = {}
        for item in args.attach:
            name, path = _split("--attach", item)
            attachments[name] = _read_file("--attach", path)
        answer = request(
            args.effect,
            _params(args),
            reason=args.reason,
            idempotency_key=args.idempotency_key,
            attachments=attachments,
            wait=args.wait,
            timeout=args.timeout,
            request_id=args.request_id,
            progress=not args.quiet,
        )
        if not args.wait:
            print(json.dumps(answer, indent=2, ensure_ascii=False))
            return 0
    print(json.dumps(answer, indent=2, ensure_ascii=False))
    return 0 if answer.get("status") == "applied" else 1


def _withdraw(request_id: str, reason: str | None) -> int:
    """0 when the request was taken back or a withdrawal written; 1 when the broker
    predates withdrawals (protocol version 2)."""
    done = withdraw(request_id, reason)
    said = {
        "unfiled": f"request {request_id} taken back before the broker read it",
        "asked": (
            f"asked the broker to withdraw request {request_id}: it is denied if it still "
            f"waits for a person (see: outbox result {request_id})"
        ),
        "unsupported": (
            f"the broker serving this sandbox predates withdrawals; request {request_id} "
            "is decided as usual"
        ),
    }[done]
    print(f"outbox: {said}", file=sys.stderr)
    return 1 if done == "unsupported" else 0


def main(argv: list[str] | None = None) -> int:
    """Run the ``outbox`` command; returns its exit status."""
    try:
        return _run(_parser().parse_args(argv))
    except (_UsageError, ValueError, OutboxError) as exc:
        print(f"outbox: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
