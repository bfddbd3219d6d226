"""The inbox's "what would change" view and /api/v1/policy/replay: the same report as
`broker policy replay`, hostile text from params neutralised, CSRF and sign-in as every
form; and "Approve and propose a rule" on a request's card."""

from __future__ import annotations

import re
from typing import Any

from broker.review.replay import replay, replay_controls
from broker.store.sqlite import SQLiteStore
from tests.web.conftest import Web, csrf_of

HOSTILE = "<script>alert(1)</script>\u202eevil"
LOOSER = """
[[rules]]
effect = "test.record"
action = "auto"
reason = "trust records"

[[rules]]
effect = "files.write"
action = "approve"
reason = "files still wait"
"""


def history(web: Web) -> None:
    for n in range(3):
        web.gated("test.record", params={"value": f"{HOSTILE}{n}"})
    for n in range(2):
        web.gated("files.write", params={"path": f"new-{n}.txt", "content": "x"})


def test_the_api_gives_the_cli_report(web: Web) -> None:
    history(web)
    got = web.client().post("/api/v1/policy/replay", json={"policy": LOOSER})
    assert got.status_code == 200, got.text
    report = got.json()
    assert (report["replayed"], report["unattended"], report["exit_code"]) == (5, 3, 3)
    assert report["by_effect"]["test.record"] == {"approve→auto": 3}
    ledger = SQLiteStore(web.harness.state / "ledger.sqlite3")
    from broker.review.replay import policy_from_text

    same = replay(
        policy_from_text(LOOSER, web.harness.registry),
        ledger.all(),
        controls=replay_controls(ledger),
    )
    ledger.close()
    assert report == {**same.to_json(), "policy": report["policy"]}
    bad = web.client().post("/api/v1/policy/replay", json={"policy": "[[rules]]\neffect = 1\n"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_policy"
    assert (
        web.client(None).post("/api/v1/policy/replay", json={"policy": LOOSER}).status_code == 401
    )


def test_the_page_shows_the_same_numbers_and_neutralises_params(web: Web) -> None:
    history(web)
    browser = web.browser()
    form = browser.get("/history/replay")
    assert form.status_code == 200
    page = browser.post(
        "/history/replay", data={"csrf": csrf_of(form.text), "policy": LOOSER, "since": "1d"}
    )
    assert page.status_code == 200, page.text
    text = page.text
    assert '<span id="replayed">5</span>' in text and '<span id="unattended">3</span>' in text
    assert '<span id="rate-before">5</span> → <span id="rate-after">2</span>' in text
    assert "<script>alert" not in text and "&lt;script&gt;alert(1)" in text
    assert "&lt;U+202E RLO&gt;" in text and "\u202e" not in text
    assert len(re.findall(r'class="change change-loosened change-unattended"', text)) == 3
    # an upload works as a paste does
    upload = browser.post(
        "/history/replay",
        data={"csrf": csrf_of(form.text)},
        files={"upload": ("new.toml", LOOSER.encode(), "text/plain")},
    )
    assert '<span id="unattended">3</span>' in upload.text


def test_the_page_refuses_a_stale_form_and_bad_policy(web: Web) -> None:
    browser = web.browser()
    stale = browser.post("/history/replay", data={"csrf": "nope", "policy": LOOSER})
    assert stale.status_code == 403
    form = browser.get("/history/replay")
    bad = browser.post("/history/replay", data={"csrf": csrf_of(form.text), "policy": "x = ["})
    assert bad.status_code == 422 and "not valid TOML" in bad.text
    assert web.client(None).get("/history/replay", follow_redirects=False).status_code == 303


def test_approve_and_propose_on_the_card(web: Web) -> None:
    waiting = web.gated("test.record", params={"value": "same"})
    browser = web.browser()
    card = browser.get(f"/requests/default/{waiting['id']}")
    assert 'id="approve-propose"' in card.text
    done = browser.post(
        f"/requests/default/{waiting['id']}/decision",
        data={
            "csrf": csrf_of(card.text),
            "verdict": "approve-propose",
            "request_sha256": waiting["request_sha256"],
        },
    )
    assert done.status_code == 200
    assert "Your approval is recorded. Proposed as rule 1 (proposed)" in done.text
    assert web.harness.wait(waiting["id"])["status"] == "applied"
    ledger = SQLiteStore(web.harness.state / "ledger.sqlite3")
    proposal = ledger.controls("proposal")["1"]
    ledger.close()
    assert proposal["rule"]["when"] == {"value": "same"} and proposal["proposed_by"] == "alice"


def test_what_people_denied_comes_first_and_loudest(web: Web, capsys: Any) -> None:
    """A record bob denied would now be auto-applied: the API, the page and the CLI each
    say 'would auto-apply 1 request people denied' first, and its row says 'was: denied
    by bob'; a record still waiting says only what it is."""
    denied, waiting = web.gated(), web.gated()
    web.client("bob").post(
        f"/api/v1/requests/default/{denied['id']}/decision",
        json={"verdict": "deny", "reason": "no", "request_sha256": denied["request_sha256"]},
    )
    web.harness.wait(denied["id"])
    report = web.client().post("/api/v1/policy/replay", json={"policy": LOOSER}).json()
    assert report["warning"] == "would auto-apply 1 request people denied"
    assert report["would_auto_apply_denied"] == 1
    first, second = report["changes"]
    assert (first["id"], first["was"], first["people_denied"]) == (
        denied["id"],
        "denied by bob",
        True,
    )
    assert (second["id"], second["was"], second["people_denied"]) == (
        waiting["id"],
        "pending",
        False,
    )

    browser = web.browser()
    form = browser.get("/history/replay")
    page = browser.post("/history/replay", data={"csrf": csrf_of(form.text), "policy": LOOSER}).text
    loud = page.index("This policy would auto-apply 1 request people denied")
    assert loud < page.index('id="replayed"')
    assert "was: denied by bob" in page and "change-overruled" in page

    from broker.cli.rules import print_report
    from broker.review.replay import policy_from_text

    ledger = SQLiteStore(web.harness.state / "ledger.sqlite3")
    try:
        print_report(
            replay(
                policy_from_text(LOOSER, web.harness.registry),
                ledger.all(),
                controls=replay_controls(ledger),
            )
        )
    finally:
        ledger.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == " WOULD AUTO-APPLY 1 REQUEST PEOPLE DENIED "
    assert f"default/{denied['id']}" in lines[1] and "was: denied by bob" in lines[1]


def test_the_form_starts_from_the_current_policy_and_diffs_the_pasted_one(
    web: Web, served: Any, tmp_path: Any
) -> None:
    """The form holds the policy the broker serves; a pasted one is shown as a diff of it."""

    current = tmp_path / "policy.toml"
    current.write_text('[[rules]]\neffect = "test.record"\naction = "approve"\n', "utf-8")
    inbox = served[0].app.state.inbox
    inbox.config = inbox.config._replace(policy_path=current)
    browser = web.browser()
    form = browser.get("/history/replay").text
    assert "effect = &#34;test.record&#34;\naction = &#34;approve&#34;" in form
    pasted = current.read_text("utf-8").replace('"approve"', '"auto"')
    page = browser.post("/history/replay", data={"csrf": csrf_of(form), "policy": pasted}).text
    (diff,) = re.findall(
        r'<pre class="body numbered body-diff" id="policy-diff">(.*?)</pre>', page, re.S
    )
    assert '<span class="line del">-action = &quot;approve&quot;</span>' in diff
    assert '<span class="line add">+action = &quot;auto&quot;</span>' in diff
