"""The envelope, then the effect's params, against JSON Schema (Draft 2020-12).

Validators are compiled once; every error becomes an Issue with a JSON-pointer path
so that an agent can fix its request.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.errors import Issue, Rejected
from broker.names import ATTACHMENT_NAME, REQUEST_ID

if TYPE_CHECKING:  # jsonschema loads with the first schema compiled, not with every command
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

SCHEMA_DIRS = (
    Path(__file__).resolve().parent.parent / "schemas",  # a checkout or editable install
    Path(__file__).resolve().parent / "_schemas",  # an installed wheel
)


@cache
def load_schema(name: str) -> dict[str, Any]:
    """A schema shipped in schemas/, by file stem (`envelope`, `files.write`)."""
    for folder in SCHEMA_DIRS:
        path = folder / f"{name}.json"
        if path.is_file():
            schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return schema
    raise FileNotFoundError(f"no schema named {name}.json in {SCHEMA_DIRS[0]}")


def check_schema(schema: Mapping[str, Any], where: str) -> None:
    """Check a schema against Draft 2020-12's meta-schema, once, at start.

    jsonschema-rs checks it (a fraction of a millisecond, where the stdlib validator
    takes tens and loads jsonschema for every command that registers a handler)."""
    import jsonschema_rs

    try:
        jsonschema_rs.meta.validate(dict(schema))
    except jsonschema_rs.ValidationError as exc:
        from broker.errors import RegistryError

        said = str(exc).split("\n", 1)[0]
        raise RegistryError(f"{where}: not a valid JSON Schema: {said}") from exc


def _pointer(parts: Iterable[Any]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _issues(errors: Iterable[ValidationError], prefix: tuple[Any, ...]) -> list[Issue]:
    found: list[Issue] = []
    seen: set[tuple[str, str]] = set()
    for error in sorted(errors, key=lambda e: (list(map(str, e.absolute_path)), e.validator)):
        path = prefix + tuple(error.absolute_path)
        code = str(error.validator)
        message = error.message
        if code == "required" and isinstance(error.validator_value, list):
            missing = [
                name
                for name in error.validator_value
                if isinstance(error.instance, dict) and name not in error.instance
            ]
            for name in missing:
                pointer = _pointer((*path, name))
                if (pointer, "required") not in seen:  # one error per missing name
                    seen.add((pointer, "required"))
                    found.append(Issue(pointer, "required", f"{name!r} is required"))
            continue
        if (
            code == "additionalProperties"
            and isinstance(error.instance, dict)
            and isinstance(error.schema, Mapping)
        ):
            allowed = set(error.schema.get("properties", {}))
            for name in sorted(set(error.instance) - allowed):
                found.append(
                    Issue(_pointer((*path, name)), "unknown_property", f"{name!r} is not allowed")
                )
            continue
        if len(message) > 300:
            message = message[:300] + "…"
        found.append(Issue(_pointer(path), code, message))
    return found


class Compiled:
    """One schema, compiled twice: jsonschema-rs answers "valid?" in a microsecond on the
    accept path; the stdlib validator says what is wrong (its messages are the better
    ones). Where the two disagree the stricter wins (Rust's `$` ends the text, Python's
    accepts a trailing newline); a pattern Rust cannot compile leaves the stdlib alone."""

    def __init__(self, schema: Mapping[str, Any], where: str) -> None:
        check_schema(schema, where)
        self._schema = schema
        self._slow: Draft202012Validator | None = None
        try:
            import jsonschema_rs

            self.fast: Any = jsonschema_rs.validator_for(dict(schema))
        except Exception:  # a construct only Python's re knows: no fast path for it
            self.fast = None

    def slow(self) -> Draft202012Validator:
        """The stdlib's validator, made when a request first fails (jsonschema loads then)."""
        if self._slow is None:
            from jsonschema import Draft202012Validator

            self._slow = Draft202012Validator(self._schema)
        return self._slow

    def issues(self, instance: Any, prefix: tuple[Any, ...]) -> list[Issue]:
        if self.fast is not None and self.fast.is_valid(instance):
            return []
        found = _issues(self.slow().iter_errors(instance), prefix)
        if not found and self.fast is not None:
            for error in self.fast.iter_errors(instance):
                code = str(error.schema_path[-1]) if error.schema_path else "invalid"
                message = str(error.message)[:300]
                found.append(Issue(_pointer((*prefix, *error.instance_path)), code, message))
        return found


class Validator:
    """The envelope's validator, and each effect's, compiled once: at start for a
    mapping of schemas, or the first time an effect is seen when given `schema_of`."""

    def __init__(
        self,
        schemas: Mapping[str, Mapping[str, Any]] | Callable[[str], Mapping[str, Any] | None],
        *,
        names: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        self._envelope = Compiled(load_schema("envelope"), "schemas/envelope.json")
        self._params: dict[str, Compiled] = {}
        self._schema_of: Callable[[str], Mapping[str, Any] | None] | None = None
        if isinstance(schemas, Mapping):
            self._params = {name: Compiled(s, f"effect {name}") for name, s in schemas.items()}
        else:
            self._schema_of = schemas
        self._names = names  # every effect's name, for "did you mean" (else those compiled)

    def _for(self, effect: str) -> Compiled | None:
        found = self._params.get(effect)
        if found is None and self._schema_of is not None:
            schema = self._schema_of(effect)
            if schema is not None:
                found = self._params[effect] = Compiled(schema, f"effect {effect}")
        return found

    def envelope(self, doc: Any) -> None:
        """Raise Rejected listing every envelope error; ids are checked exactly."""
        if not isinstance(doc, dict):
            raise Rejected(
                "invalid: the request must be a JSON object",
                [Issue("", "type", "the request must be a JSON object")],
            )
        issues = self._envelope.issues(doc, ())
        # JSON Schema's `$` (in Python) also matches before a trailing newline: check exactly.
        rid = doc.get("id")
        if (
            isinstance(rid, str)
            and not REQUEST_ID.fullmatch(rid)
            and not any(i.path == "/id" for i in issues)
        ):
            issues.append(Issue("/id", "pattern", "the id must match [A-Za-z0-9_-]{1,64}"))
        names = doc.get("attachments")
        for i, name in enumerate(names if isinstance(names, list) else ()):
            bad = isinstance(name, str) and not ATTACHMENT_NAME.fullmatch(name)
            if bad and not any(x.path == f"/attachments/{i}" for x in issues):
                issues.append(Issue(f"/attachments/{i}", "pattern", "bad attachment name"))
        if issues:
            raise Rejected(_summary(issues), issues)

    def params(self, effect: str, params: Any) -> None:
        validator = self._for(effect)
        if validator is None:
            hint = did_you_mean(effect, self._names() if self._names else self._params)
            raise Rejected(
                f"invalid: unknown effect {effect!r}{hint}; `outbox effects` lists the "
                "effects this sandbox may ask for",
                [Issue("/effect", "unknown_effect", f"no effect named {effect!r}{hint}")],
            )
        issues = validator.issues(params, ("params",))
        if issues:
            raise Rejected(_summary(issues), issues)

    def known(self, effect: str) -> bool:
        return self._for(effect) is not None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """ "; did you mean 'files.write'?": the registered names nearest to `name` (a typo),
    else its integration's effects (a verb it does not have), else ""."""
    names = sorted(known)
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if not near:  # a verb the integration does not have: its effects
        integration = name.split(".", 1)[0] + "."
        near = [n for n in names if n.startswith(integration)][:5]
    if not near:
        return ""
    return "; did you mean " + " or ".join(repr(n) for n in near) + "?"


def _summary(issues: list[Issue]) -> str:
    first = issues[0]
    more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
    where = first.path or "the request"
    return f"invalid: {where}: {first.message}{more}"
