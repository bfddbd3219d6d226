"""Coverage-guided fuzzing of the intake parser and envelope check with atheris.

    python tests/fuzz/atheris_intake.py -max_total_time=20 [corpus dir]

(tests/fuzz/test_atheris.py runs it so, with a seed corpus and a JSON dictionary.)

Each input is a file name, a newline, then the file's bytes. Names must classify without
error; bytes must either parse as strict JSON or be Rejected with exactly one issue;
what parses must have a canonical form and pass or fail the envelope check with
Rejected, never anything else. Any other exception is a crash atheris reports.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

with atheris.instrument_imports():
    from broker.errors import Rejected
    from broker.intake import claims as intake
    from broker.models import canonical_json
    from broker.validation import Validator

VALIDATOR = Validator({"test.record": {"type": "object"}})
CODES = {
    "bad_utf8",
    "bad_json",
    "too_deep",
    "duplicate_key",
    "non_finite_number",
    "bad_number",
    "bad_unicode",
}


def test_one_input(data: bytes) -> None:
    raw_name, _, body = data.partition(b"\n")
    name = raw_name.decode("utf-8", "surrogateescape")  # as os.listdir gives names
    kind, stem, attachment = intake.classify(name)
    if kind is intake.Kind.REQUEST:
        assert intake.REQUEST_NAME.fullmatch(stem) and name == f"{stem}.json"
    if kind is intake.Kind.ATTACHMENT:
        assert name == f"{stem}.{attachment}.bin"
    try:
        doc = intake.parse_json(body, 64)
    except Rejected as exc:
        assert len(exc.issues) == 1 and exc.issues[0].code in CODES, exc.issues
        return
    canonical_json(doc)
    try:
        VALIDATOR.envelope(doc)
        VALIDATOR.params(doc["effect"], doc["params"])
    except Rejected as exc:
        assert exc.issues, "a rejection without an issue"


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
