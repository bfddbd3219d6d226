"""The demo's agent: it has no credentials and no network, only its outbox.

It asks for two effects and prints what came back:
1. write a new report (reversible: the policy applies it at once);
2. overwrite that report (irreversible: it waits for a person, who decides).
"""

from __future__ import annotations

import json
import sys

import outbox


def show(label: str, result: dict[str, object]) -> None:
    print(f"agent: {label}: {result['status']} — {result['reason']}", flush=True)
    if result.get("output"):
        print(f"agent:   output {json.dumps(result['output'])}", flush=True)


def main() -> int:
    print("agent: asking to write report.md (a new file: reversible)", flush=True)
    first = outbox.request(
        "files.write",
        {"path": "report.md", "content": "# Findings\n\nAll 42 tests pass.\n"},
        reason="save the findings for the user",
        timeout=60,
    )
    show("report.md", first)
    print("agent: asking to overwrite report.md (irreversible: a person decides)", flush=True)
    second = outbox.request(
        "files.write",
        {
            "path": "report.md",
            "content": "# Findings\n\nAll 42 tests pass.\nThe flaky one is fixed too.\n",
            "overwrite": True,
        },
        reason="add the fix I just made",
        timeout=900,
    )
    show("overwrite", second)
    return 0 if first["status"] == "applied" and second["status"] == "applied" else 1


if __name__ == "__main__":
    sys.exit(main())
