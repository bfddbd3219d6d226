"""Runs the atheris harness for the intake parser for a bounded time (8 s, or 5 min
under BROKER_SOAK=1, `make soak`) and fails on any crash it finds."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.crash.support import soak
from tests.fuzz.conftest import FIGURES

HARNESS = Path(__file__).with_name("atheris_intake.py")
SECONDS = 300 if soak() else 8
SEEDS = [
    b'req.json\n{"version": 1, "id": "a", "effect": "test.record", "params": {"value": 1}}',
    b'x.y.bin\n{"version": 1, "effect": "test.record", "params": {}, "reason": "\\u00e9"}',
    b'.tmp.json\n{"a": [1, 2.5e3, -0, true, false, null, "\\ud83d\\ude00"]}',
    b'r.json\n{"a": NaN, "b": Infinity, "c": 1e999, "a": 1}',
    b'r.json\n{"version": 1, "effect": "x.y", "params": {}, "attachments": ["f"], "id": "a\\n"}',
    b"deep.json\n" + b"[" * 70 + b"]" * 70,
]
TOKENS = [
    '"version"',
    '"id"',
    '"effect"',
    '"params"',
    '"attachments"',
    '"idempotency_key"',
    "NaN",
    "-Infinity",
    "1e999",
    "\\ud800",
    "\\u0000",
    '"test.record"',
    ".json",
    ".bin",
    "[[[[[[[[",
]


def _quoted(token: str) -> str:
    return '"' + token.replace("\\", "\\\\").replace('"', '\\"') + '"'


@pytest.mark.skipif(
    importlib.util.find_spec("atheris") is None,
    reason="atheris is not installed (pip install -e '.[dev]' installs it)",
)
def test_atheris_finds_no_crash_in_the_intake_parser(tmp_path: Path) -> None:
    """Coverage-guided fuzzing of the intake parser for a bounded time finds no crash."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, seed in enumerate(SEEDS):
        (corpus / f"seed-{i}").write_bytes(seed)
    tokens = tmp_path / "json.dict"
    tokens.write_text("".join(f"t{i}={_quoted(t)}\n" for i, t in enumerate(TOKENS)))

    done = subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            f"-max_total_time={SECONDS}",
            "-rss_limit_mb=2048",
            "-timeout=10",
            f"-dict={tokens}",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=SECONDS + 120,
        check=False,
    )
    runs = re.search(r"Done (\d+) runs in (\d+) second", done.stderr)
    cov = re.findall(r"cov: (\d+)", done.stderr)
    FIGURES.append(
        f"atheris: {runs.group(1) if runs else '?'} inputs in {runs.group(2) if runs else '?'} s, "
        f"coverage {cov[-1] if cov else '?'} edges, corpus {len(list(corpus.iterdir()))} files"
    )

    crash = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-"))]
    assert done.returncode == 0 and not crash, done.stderr[-4000:]
    assert runs is not None, done.stderr[-2000:]
