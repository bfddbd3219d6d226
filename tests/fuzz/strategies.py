"""Hypothesis strategies for what a hostile or careless agent writes into its outbox."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import strategies as st

_ids = itertools.count()

JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
EFFECTS = st.sampled_from(
    ["test.record", "test.record", "test.gated", "test.nothing", "Test.Record", "", "a.b.c.d"]
) | st.text(max_size=20)


@st.composite
def unique_ids(draw: st.DrawFn) -> Any:
    """A fresh valid id, or something that is not an id at all."""
    return draw(
        st.sampled_from(["fresh", "fresh", "fresh", "bad"]).flatmap(
            lambda kind: (
                st.just(f"u{next(_ids)}")
                if kind == "fresh"
                else st.one_of(
                    st.text(max_size=70),
                    st.integers(),
                    st.none(),
                    st.just("a" * 65),
                    st.just("x/y"),
                )
            )
        )
    )


PARAMS = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "value": st.one_of(st.text(max_size=30), st.integers(), JSON_VALUES),
            "fail": st.text(max_size=20),
        },
    ),
    JSON_VALUES,
)

VALID_PARAMS = st.fixed_dictionaries(
    {},
    optional={
        "value": st.text(max_size=30) | st.integers(-(2**31), 2**31),
        "fail": st.text(max_size=9),
    },
)
JUNK_FIELDS = {
    "version": st.sampled_from([2, "1", 1.0, None, True, 0]),
    "id": unique_ids(),
    "effect": EFFECTS,
    "params": PARAMS,
    "reason": st.text(max_size=60) | st.integers(),
    "idempotency_key": st.text(max_size=12).map(lambda k: f"k{next(_ids)}-{k}"),  # no replays
    "attachments": st.lists(st.text(max_size=6), max_size=2),
    "approved": st.booleans(),
    "decided_by": st.text(max_size=10),
    "status": st.just("applied"),
}


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    """A valid request for test.record or test.gated, then none to three corruptions."""
    doc: dict[str, Any] = {
        "version": 1,
        "id": f"u{next(_ids)}",
        "effect": draw(st.sampled_from(["test.record", "test.record", "test.gated"])),
        "params": draw(VALID_PARAMS),
    }
    if draw(st.booleans()):
        doc["reason"] = draw(st.text(max_size=80))
    for key in draw(st.lists(st.sampled_from(sorted(JUNK_FIELDS)), max_size=3, unique=True)):
        if draw(st.booleans()) and key in doc:
            del doc[key]
        else:
            doc[key] = draw(JUNK_FIELDS[key])
    return doc


ENVELOPES = envelopes()


def _dup_key(text: str) -> str:
    return text.replace("{", '{"version": 1, ', 1) if text.startswith("{") else text


def _lone_surrogate(text: str) -> str:
    return text.replace('"', '"\\ud800', 1)


def _deep(text: str) -> str:
    return "[" * 200 + text + "]" * 200


MUTATIONS = st.sampled_from(
    [
        *[lambda t: t] * 16,
        _dup_key,
        _lone_surrogate,
        _deep,
        lambda t: "\ufeff" + t,
        lambda t: t[: len(t) // 2],
        lambda t: t + " {}",
        lambda t: t.replace(":", "::", 1),
    ]
)


@st.composite
def request_bytes(draw: st.DrawFn) -> bytes:
    """Bytes an agent might write as a request: mostly envelope-shaped, some garbage."""
    kind = draw(st.sampled_from(["envelope"] * 6 + ["binary", "text"]))
    if kind == "binary":
        return draw(st.binary(max_size=300))
    if kind == "text":
        return draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    doc = draw(ENVELOPES)
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()), allow_nan=True)
    text = draw(MUTATIONS)(text)
    data = text.encode("utf-8", "surrogatepass")
    flip, where, byte = (
        draw(st.integers(0, 9)),
        draw(st.integers(0, 2**16)),
        draw(st.integers(0, 255)),
    )
    if flip == 0 and data:
        at = where % len(data)  # not drawn from len(data): ids make lengths vary between runs
        data = data[:at] + bytes([byte]) + data[at + 1 :]
    return data
