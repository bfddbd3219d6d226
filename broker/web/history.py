"""The history page and its CSV export: decided requests, newest first by the time each
row shows (completed, else decided, else received), narrowed by effect, sandbox,
outcome, a search over what people read (ref, effect, what, outcome, actor, reason) and
a date range; `/history.csv` is the same rows for audits."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from broker.clock import parse_iso
from broker.models import Record
from broker.outcomes import service_warning
from broker.untrusted import neutralize
from broker.web.inbox import STATES, Filters, Inbox
from broker.web.pages import PagesDep

DECIDED = tuple(s for s in STATES if s not in ("received", "pending"))
SHOWN = 200
EXPORTED = 10_000
COLUMNS = ("when", "ref", "effect", "what", "outcome", "warning", "by", "reason", "sha256")
router = APIRouter(include_in_schema=False)


@dataclass(frozen=True)
class Range:
    """A day range as the date inputs give it (YYYY-MM-DD, UTC, both ends included)."""

    start: datetime | None = None
    end: datetime | None = None

    @classmethod
    def parse(cls, since: str, until: str) -> Range:
        return cls(_day(since), (d + timedelta(days=1)) if (d := _day(until)) else None)

    def keeps(self, moment: datetime | None) -> bool:
        if moment is None:
            return self.start is None and self.end is None
        return (self.start is None or moment >= self.start) and (
            self.end is None or moment < self.end
        )


def _day(text: str) -> datetime | None:
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        return None


def shown_at(record: Record) -> str:
    """The time a history row shows, and is sorted by."""
    return record.completed_at or record.decided_at or record.received_at


def what_of(record: Record) -> str:
    """The file, URL or recipient: the preview's title, else its target."""
    preview = record.preview or {}
    return str(preview.get("title") or preview.get("target") or "")


def _text(record: Record) -> str:
    parts = (record.sandbox, record.id, record.effect, what_of(record), record.state)
    return " ".join(str(p or "") for p in (*parts, record.decided_by, record.reason)).casefold()


def rows(inbox: Inbox, filters: Filters, q: str, when: Range, limit: int) -> list[Record]:
    """Decided requests matching every filter, newest first by the time shown."""
    states: Iterable[str] = [filters.status] if filters.status else DECIDED
    with inbox.ledger() as ledger:
        found = ledger.search(
            effect=filters.effect, sandbox=filters.sandbox, states=states, limit=EXPORTED
        )
    needle = q.strip().casefold()
    kept = [
        r
        for r in found
        if when.keeps(parse_iso(shown_at(r))) and (not needle or needle in _text(r))
    ]
    return sorted(kept, key=shown_at, reverse=True)[:limit]


@dataclass(frozen=True)
class Query:
    """What the history page and its export are narrowed by (query parameters)."""

    effect: str = ""
    sandbox: str = ""
    outcome: str = ""
    q: str = ""
    since: str = ""
    until: str = ""

    @property
    def filters(self) -> Filters:
        return Filters(self.effect or None, self.sandbox or None, self.outcome or None)

    def rows(self, inbox: Inbox, limit: int) -> list[Record]:
        return rows(inbox, self.filters, self.q, Range.parse(self.since, self.until), limit)


QueryDep = Annotated[Query, Depends()]


@router.get("/history")
def history(request: Request, pages: PagesDep, query: QueryDep) -> Response:
    who = pages.signed_in(request)
    if who is None:
        return pages.to_login(request)
    cursor = pages.inbox.cursor()  # before the records: the page is at least this new
    records = query.rows(pages.inbox, SHOWN)
    filters = query.filters
    return pages.html(
        "history.html",
        request,
        who,
        cursor=cursor,
        records=records,
        filters=filters,
        search={"q": query.q, "since": query.since, "until": query.until},
        export=request.url.query,
        effects=pages.inbox.effects(),
        outcomes=DECIDED,
        what_of=what_of,
        shown_at=shown_at,
    )


@router.get("/history.csv")
def history_csv(request: Request, pages: PagesDep, query: QueryDep) -> Response:
    who = pages.signed_in(request)
    if who is None:
        return pages.to_login(request)
    found = query.rows(pages.inbox, EXPORTED)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    for r in found:
        warning = service_warning(r.state, r.output) or ""
        values = (shown_at(r), f"{r.sandbox}/{r.id}", r.effect or "", what_of(r), r.state)
        writer.writerow([_cell(v) for v in (*values, warning, r.decided_by, r.reason, r.sha256)])
    return Response(
        buffer.getvalue(),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": 'attachment; filename="broker-history.csv"'},
    )


def _cell(value: object) -> str:
    """Neutralised, and never a formula a spreadsheet would run (CSV injection)."""
    text = neutralize(str(value or ""))
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text
