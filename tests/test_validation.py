"""Envelope and params validation: every error is reported at its JSON-pointer path."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from broker.errors import RegistryError, Rejected
from broker.testing import FAKE_SCHEMA, BrokerHarness, FakeHandler
from broker.validation import Validator, load_schema

ROOT = Path(__file__).resolve().parent.parent
RESULT_SCHEMA = Draft202012Validator(json.loads((ROOT / "schemas" / "result.json").read_text()))

NESTED_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["n"],
                "properties": {"n": {"type": "integer"}},
            },
        }
    },
}


# -- helpers --------------------------------------------------------------------


def check_results(results_dir: Path) -> None:
    """Every result file in `results_dir` matches schemas/result.json."""
    for path in results_dir.iterdir():
        if path.name.startswith("."):
            continue
        errors = [e.message for e in RESULT_SCHEMA.iter_errors(json.loads(path.read_bytes()))]
        assert not errors, f"{path.name}: {errors}"


def answer(
    h: BrokerHarness, doc: dict[str, Any], name: str, *, terminal: bool = True
) -> dict[str, Any]:
    """Write `doc` as `<name>.json`, wait for the result under `name`, check every schema."""
    h.write(f"{name}.json", doc)
    result = h.wait(name, timeout=5.0, terminal=terminal)
    check_results(h.results)
    return result


def errors_of(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["path"], e["code"]) for e in result["errors"]]


def issues(call: Callable[[], None]) -> list[tuple[str, str]]:
    """The (path, code) pairs that `call` raised Rejected with, in order."""
    with pytest.raises(Rejected) as info:
        call()
    assert info.value.reason.startswith("invalid: ")
    for issue in info.value.issues:
        assert issue.message
    return [(i.path, i.code) for i in info.value.issues]


def envelope(**changes: Any) -> dict[str, Any]:
    """A valid envelope for test.record, with `changes` applied (None removes a key)."""
    doc: dict[str, Any] = {"version": 1, "id": "req-1", "effect": "test.record", "params": {}}
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    return doc


# -- fixtures -------------------------------------------------------------------


@pytest.fixture(scope="module")
def validator() -> Validator:
    """A Validator knowing files.write, test.record and test.nested."""
    return Validator(
        {
            "files.write": load_schema("files.write"),
            "test.record": FAKE_SCHEMA,
            "test.nested": NESTED_SCHEMA,
        }
    )


@pytest.fixture(scope="module")
def gated() -> FakeHandler:
    """An irreversible fake effect, test.gated: the default policy asks a person first."""
    return FakeHandler("test.gated", reversible=False, idempotent=False)


@pytest.fixture(scope="module")
def validating_harness(
    tmp_path_factory: pytest.TempPathFactory, gated: FakeHandler
) -> Iterator[BrokerHarness]:
    """A running broker with files.write (into its `exports` dir) and test.gated."""
    base = tmp_path_factory.mktemp("validation")
    (base / "exports").mkdir()
    with BrokerHarness(
        base / "h", handlers=[gated], integrations={"files": {"root": str(base / "exports")}}
    ) as h:
        yield h


@pytest.fixture
def shared_exports(validating_harness: BrokerHarness) -> Path:
    """The export root of `validating_harness`'s files.write."""
    return validating_harness.base.parent / "exports"


# -- through the running broker ---------------------------------------------------


def files_write(request_id: str, **params: Any) -> dict[str, Any]:
    return {"version": 1, "id": request_id, "effect": "files.write", "params": params}


def test_missing_param_is_reported_at_its_path(
    validating_harness: BrokerHarness, shared_exports: Path
) -> None:
    """A missing required param is `required` at /params/<name>, and nothing is written."""
    result = answer(validating_harness, files_write("miss", path="a.txt"), "miss")

    assert result["status"] == "invalid"
    assert result["effect"] == "files.write"
    assert errors_of(result) == [("/params/content", "required")]
    assert result["reason"].startswith("invalid: /params/content: ")
    assert result["request_sha256"]
    assert not (shared_exports / "a.txt").exists()


def test_param_of_wrong_type_is_reported_at_its_path(
    validating_harness: BrokerHarness, shared_exports: Path
) -> None:
    """A param of the wrong JSON type is `type` at its path."""
    result = answer(
        validating_harness, files_write("wrong-type", path="b.txt", content=5), "wrong-type"
    )

    assert result["status"] == "invalid"
    assert errors_of(result) == [("/params/content", "type")]
    assert not (shared_exports / "b.txt").exists()


def test_unknown_param_is_reported_at_its_path(
    validating_harness: BrokerHarness, shared_exports: Path
) -> None:
    """A param the effect does not define is `unknown_property` at its path."""
    doc = files_write("extra", path="c.txt", content="x", mode="0777")

    result = answer(validating_harness, doc, "extra")

    assert result["status"] == "invalid"
    assert errors_of(result) == [("/params/mode", "unknown_property")]
    assert not (shared_exports / "c.txt").exists()


def test_several_errors_are_listed_one_per_entry(validating_harness: BrokerHarness) -> None:
    """Every envelope error is listed, each with its own path, and the reason counts them."""
    doc = {"version": 3, "id": "several", "effect": "Files.Write", "params": [], "approved": True}

    result = answer(validating_harness, doc, "several")

    assert result["status"] == "invalid"
    assert sorted(errors_of(result)) == [
        ("/approved", "unknown_property"),
        ("/effect", "pattern"),
        ("/params", "type"),
        ("/version", "enum"),
    ]
    assert "(and 3 more)" in result["reason"]


def test_several_param_errors_are_listed_one_per_entry(
    validating_harness: BrokerHarness,
) -> None:
    """Two missing params and an unknown one give three entries."""
    result = answer(validating_harness, files_write("params3", overwrite="yes", x=1), "params3")

    assert sorted(errors_of(result)) == [
        ("/params/content", "required"),
        ("/params/overwrite", "type"),
        ("/params/path", "required"),
        ("/params/x", "unknown_property"),
    ]


def test_unknown_effect_is_invalid(validating_harness: BrokerHarness) -> None:
    """An effect nobody registered is `unknown_effect` at /effect, and says where to look."""
    doc = {"version": 1, "id": "no-such", "effect": "github.repo.delete", "params": {}}

    result = answer(validating_harness, doc, "no-such")

    assert result["status"] == "invalid"
    assert errors_of(result) == [("/effect", "unknown_effect")]
    assert "github.repo.delete" in result["reason"]
    near = answer(validating_harness, {**doc, "id": "typo", "effect": "files.wrte"}, "typo")
    assert "did you mean 'files.write'?" in near["reason"]
    assert "did you mean 'files.write'?" in near["errors"][0]["message"]


def test_id_with_a_trailing_newline_is_invalid(validating_harness: BrokerHarness) -> None:
    """An id "abc\\n" is rejected at /id and answered under the file name."""
    doc = {"version": 1, "id": "abc\n", "effect": "files.write", "params": {}}

    result = answer(validating_harness, doc, "newline-id")

    assert result["status"] == "invalid"
    assert result["id"] == "newline-id"
    assert ("/id", "pattern") in errors_of(result)
    assert not [n for n in validating_harness.results.iterdir() if "\n" in n.name]


def test_reason_over_2000_characters_is_invalid(validating_harness: BrokerHarness) -> None:
    """A reason of 2,001 characters is `maxLength` at /reason; 2,000 is fine."""
    doc = files_write("long-reason", path="r.txt", content="x")
    over = answer(validating_harness, dict(doc, reason="r" * 2001), "long-reason")
    doc = files_write("max-reason", path="r.txt", content="x")
    at = answer(validating_harness, dict(doc, reason="r" * 2000), "max-reason")

    assert errors_of(over) == [("/reason", "maxLength")]
    assert at["status"] == "applied"


def test_request_cannot_claim_to_be_approved(
    validating_harness: BrokerHarness, gated: FakeHandler
) -> None:
    """`"approved": true` and friends make the request invalid; nothing is applied."""
    doc = {
        "version": 1,
        "id": "pre-approved",
        "effect": "test.gated",
        "params": {"value": "sneaky"},
        "approved": True,
        "decided_by": "ops-oncall",
    }

    result = answer(validating_harness, doc, "pre-approved")

    assert result["status"] == "invalid"
    assert sorted(errors_of(result)) == [
        ("/approved", "unknown_property"),
        ("/decided_by", "unknown_property"),
    ]
    assert result["decided_by"] is None
    assert gated.applied == []


def test_gated_request_without_claims_waits_for_a_person(
    validating_harness: BrokerHarness, gated: FakeHandler
) -> None:
    """The same test.gated request, without the claim, is `pending` (so the claim mattered)."""
    doc = {"version": 1, "id": "honest", "effect": "test.gated", "params": {"value": "v"}}

    result = answer(validating_harness, doc, "honest", terminal=False)

    assert result["status"] == "pending"
    assert result["expires_at"] and result["on_timeout"] == "deny"
    assert gated.applied == []


def test_id_defaults_to_the_file_name(validating_harness: BrokerHarness) -> None:
    """A request without an id is answered under its file name."""
    doc = {"version": 1, "effect": "files.write", "params": {"path": "n.txt", "content": "n"}}

    result = answer(validating_harness, doc, "named-by-file")

    assert (result["id"], result["status"]) == ("named-by-file", "applied")


# -- Validator.envelope -----------------------------------------------------------


def test_valid_envelope_passes(validator: Validator) -> None:
    """A complete, valid envelope raises nothing."""
    validator.envelope(
        envelope(reason="why", idempotency_key="k" * 200, attachments=["fix", "b-2"])
    )


@pytest.mark.parametrize("doc", [[], "x", 1, None, True])
def test_envelope_must_be_an_object(validator: Validator, doc: Any) -> None:
    """A top-level array, string, number or null is `type` at the root."""
    assert issues(lambda: validator.envelope(doc)) == [("", "type")]


def test_envelope_lists_every_missing_member(validator: Validator) -> None:
    """An empty object lists version, effect and params as `required`, each at its path."""
    assert sorted(issues(lambda: validator.envelope({}))) == [
        ("/effect", "required"),
        ("/params", "required"),
        ("/version", "required"),
    ]


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"version": 3}, ("/version", "enum")),
        ({"version": "1"}, ("/version", "enum")),
        ({"version": True}, ("/version", "enum")),
        ({"effect": "Files.write"}, ("/effect", "pattern")),
        ({"effect": "files"}, ("/effect", "pattern")),
        ({"effect": "a.b.c.d"}, ("/effect", "pattern")),
        ({"effect": "files..write"}, ("/effect", "pattern")),
        ({"effect": "files.write "}, ("/effect", "pattern")),
        ({"effect": "files.wr-ite"}, ("/effect", "pattern")),
        ({"effect": "a." + "b" * 130}, ("/effect", "maxLength")),
        ({"effect": 7}, ("/effect", "type")),
        ({"id": "abc\n"}, ("/id", "pattern")),
        ({"id": ""}, ("/id", "pattern")),
        ({"id": "a" * 65}, ("/id", "pattern")),
        ({"id": "../x"}, ("/id", "pattern")),
        ({"id": "a b"}, ("/id", "pattern")),
        ({"id": 5}, ("/id", "type")),
        ({"params": []}, ("/params", "type")),
        ({"params": "x"}, ("/params", "type")),
        ({"reason": "r" * 2001}, ("/reason", "maxLength")),
        ({"reason": 3}, ("/reason", "type")),
        ({"idempotency_key": ""}, ("/idempotency_key", "minLength")),
        ({"idempotency_key": "k" * 201}, ("/idempotency_key", "maxLength")),
        ({"attachments": ["ok", "bad name"]}, ("/attachments/1", "pattern")),
        ({"attachments": ["a\n"]}, ("/attachments/0", "pattern")),
        ({"attachments": ["a", "a"]}, ("/attachments", "uniqueItems")),
        ({"attachments": [f"a{i}" for i in range(17)]}, ("/attachments", "maxItems")),
        ({"approved": True}, ("/approved", "unknown_property")),
        ({"status": "applied"}, ("/status", "unknown_property")),
    ],
)
def test_envelope_error_is_reported_at_its_path(
    validator: Validator, changes: dict[str, Any], expected: tuple[str, str]
) -> None:
    """One bad member gives exactly one issue, at that member's JSON pointer."""
    assert issues(lambda: validator.envelope(envelope(**changes))) == [expected]


def test_envelope_accepts_the_longest_allowed_values(validator: Validator) -> None:
    """A 64-character id, a 2,000-character reason and 16 attachments are allowed."""
    validator.envelope(
        envelope(id="a" * 64, reason="r" * 2000, attachments=[f"a{i}" for i in range(16)])
    )


def test_effect_with_a_trailing_newline_is_not_accepted(validator: Validator) -> None:
    """ "files.write\\n" is refused at /effect, by the envelope or as an unknown effect."""
    doc = envelope(effect="files.write\n")
    found: list[tuple[str, str]] = []
    try:
        validator.envelope(doc)
    except Rejected as exc:
        found = [(i.path, i.code) for i in exc.issues]
    if not found:
        found = issues(lambda: validator.params(doc["effect"], {"path": "a", "content": "b"}))
    assert [path for path, _ in found] == ["/effect"]


def test_envelope_summary_names_the_first_path_and_counts_the_rest(
    validator: Validator,
) -> None:
    """The reason an agent reads names one problem and says how many more there are."""
    with pytest.raises(Rejected) as info:
        validator.envelope({"version": 3, "id": "a b", "effect": "X", "params": 1, "extra": 1})
    assert len(info.value.issues) == 5
    assert info.value.reason.startswith(f"invalid: {info.value.issues[0].path}: ")
    assert info.value.reason.endswith("(and 4 more)")


# -- Validator.params ---------------------------------------------------------------


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"path": "a"}, [("/params/content", "required")]),
        ({}, [("/params/content", "required"), ("/params/path", "required")]),
        ({"path": "a", "content": 5}, [("/params/content", "type")]),
        ({"path": "", "content": "x"}, [("/params/path", "minLength")]),
        ({"path": "a", "content": "x", "overwrite": "yes"}, [("/params/overwrite", "type")]),
        ({"path": "a", "content": "x", "extra": 1}, [("/params/extra", "unknown_property")]),
        ({"path": "a", "content": "x", "a/b~c": 1}, [("/params/a~1b~0c", "unknown_property")]),
        (
            {"path": "a", "content": "x", "z": 1, "y": 2},
            [("/params/y", "unknown_property"), ("/params/z", "unknown_property")],
        ),
    ],
    ids=[
        "missing one",
        "missing two",
        "wrong type",
        "too short",
        "wrong type boolean",
        "unknown",
        "unknown needing escapes",
        "two unknown",
    ],
)
def test_params_error_is_reported_at_its_path(
    validator: Validator, params: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    """files.write params errors carry /params/<name> paths, JSON-pointer escaped."""
    assert sorted(issues(lambda: validator.params("files.write", params))) == expected


def test_params_error_paths_reach_into_arrays(validator: Validator) -> None:
    """Errors inside arrays of objects are reported with their indices."""
    params = {"items": [{"n": 1}, {"n": "x"}, {}]}
    assert sorted(issues(lambda: validator.params("test.nested", params))) == [
        ("/params/items/1/n", "type"),
        ("/params/items/2/n", "required"),
    ]


def test_valid_params_pass(validator: Validator) -> None:
    """Params that match the effect's schema raise nothing."""
    validator.params("files.write", {"path": "a/b.txt", "content": "", "overwrite": True})
    validator.params("test.record", {"value": 3})


def test_unknown_effect_is_reported_at_effect(validator: Validator) -> None:
    """An unregistered effect is `unknown_effect` at /effect; the reason says how to list them."""
    with pytest.raises(Rejected) as info:
        validator.params("github.repo.delete", {})
    assert [(i.path, i.code) for i in info.value.issues] == [("/effect", "unknown_effect")]
    assert "outbox effects" in info.value.reason
    assert validator.known("files.write") and not validator.known("github.repo.delete")


def test_unknown_effect_names_the_nearest_registered_ones(validator: Validator) -> None:
    """A typo gets "did you mean" with the near names, in the reason and in the error."""
    with pytest.raises(Rejected) as info:
        validator.params("files.writ", {})
    assert "did you mean 'files.write'?" in info.value.reason
    assert "did you mean 'files.write'?" in info.value.issues[0].message
    with pytest.raises(Rejected) as info:
        validator.params("zzz.qqq", {})
    assert "did you mean" not in info.value.reason


def test_error_messages_do_not_echo_huge_values(validator: Validator) -> None:
    """A 100 kB wrong-typed value yields a message of a few hundred characters at most."""
    with pytest.raises(Rejected) as info:
        validator.params("test.nested", {"items": "x" * 100_000})
    assert all(len(i.message) <= 400 for i in info.value.issues)
    assert len(info.value.reason) <= 500


def test_invalid_effect_schema_is_refused_at_start() -> None:
    """A schema that is not valid JSON Schema stops the Validator, naming the effect."""
    with pytest.raises(RegistryError, match=r"bad\.schema"):
        Validator({"bad.schema": {"type": "no-such-type"}})
