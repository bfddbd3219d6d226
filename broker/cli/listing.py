"""How the listing commands print rows (`pending`, `stats`, `effects`, `sandbox ls`,
`audit tail`), every cell neutralised first:

- at a terminal, a table as wide as the terminal when it fits; when it does not, each
  row as a block (its names on one line, the other columns as `name: value` lines
  wrapped to the width), so ids, effects and paths are never cut;
- piped, plain aligned lines, one row per line, whatever their length;
- `--tsv`, a header and one tab-separated line per row, for scripts (`--json` is each
  command's own).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from broker.cli.common import fail, out
from broker.untrusted import neutralize

TsvOpt = Annotated[bool, typer.Option("--tsv", help="tab-separated lines for scripts")]
MIN_WRAP = 24  # a column of free text narrower than this reads worse than a block
GAP = "  "


@dataclass(frozen=True)
class Column:
    """One column: free text (`wrap`) may wrap at a terminal; the others never do. In a
    block, the `lead` columns (the row's name) come first, on a line of their own."""

    title: str
    wrap: bool = False
    right: bool = False
    lead: bool = False


def choose(json_out: bool, tsv: bool) -> None:
    """Refuse --json with --tsv: one line, exit 2."""
    if json_out and tsv:
        fail("--json and --tsv: choose one")


def show(columns: Sequence[Column], rows: Sequence[Sequence[str]], *, tsv: bool = False) -> None:
    """Print `rows` (untrusted strings) as the output's reader needs them."""
    cells = [[neutralize(str(value)) for value in row] for row in rows]
    if tsv:
        _tsv(columns, cells)
    elif not sys.stdout.isatty():
        _plain(columns, cells)
    else:
        width, height = shutil.get_terminal_size()  # $COLUMNS, else the terminal's
        if _fits(columns, cells, width):
            # both sizes given: rich takes neither from TERM (a dumb one reads as 80)
            wide = Console(file=out.file, width=width, height=height, highlight=False)
            wide.print(_table(columns, cells))
        else:
            _blocks(columns, cells, width)


def _tsv(columns: Sequence[Column], cells: list[list[str]]) -> None:
    # neutralised cells hold no tab or newline (they show as \x09, \x0a)
    lines = ["\t".join(c.title for c in columns), *("\t".join(row) for row in cells)]
    sys.stdout.write("".join(line + "\n" for line in lines))


def _widths(columns: Sequence[Column], cells: list[list[str]]) -> list[int]:
    return [
        max([cell_len(c.title), *(cell_len(row[i]) for row in cells)])
        for i, c in enumerate(columns)
    ]


def _pad(text: str, width: int, right: bool) -> str:
    space = " " * (width - cell_len(text))
    return space + text if right else text + space


def _plain(columns: Sequence[Column], cells: list[list[str]]) -> None:
    widths = _widths(columns, cells)
    for row in [[c.title for c in columns], *cells]:
        parts = [_pad(v, w, c.right) for v, w, c in zip(row, widths, columns, strict=True)]
        sys.stdout.write(GAP.join(parts).rstrip() + "\n")


def _fits(columns: Sequence[Column], cells: list[list[str]], width: int) -> bool:
    """Whether a table fits `width` with every column but the free text whole, and
    each free-text column at least MIN_WRAP wide (or whole, if narrower)."""
    widths = _widths(columns, cells)
    need = sum(min(w, MIN_WRAP) if c.wrap else w for w, c in zip(widths, columns, strict=True))
    return need + 3 * len(columns) + 1 <= width


def _table(columns: Sequence[Column], cells: list[list[str]]) -> Table:
    widths = _widths(columns, cells)
    table = Table(expand=any(c.wrap for c in columns))  # free text takes the rest
    for column, width in zip(columns, widths, strict=True):
        table.add_column(
            column.title,
            justify="right" if column.right else "left",
            no_wrap=not column.wrap,
            overflow="fold",  # never an ellipsis: a cut id cannot be told from another
            min_width=None if column.wrap else width,
            ratio=1 if column.wrap else None,
        )
    for row in cells:
        table.add_row(*(Text(v) for v in row))
    return table


def _blocks(columns: Sequence[Column], cells: list[list[str]], width: int) -> None:
    """Each row as a block: its lead columns on the first line, then the others in
    order as `title: value`, short ones several to a line, free text wrapped."""
    lead = [i for i, c in enumerate(columns) if c.lead] or [0]
    rest = [i for i in range(len(columns)) if i not in lead]
    for row in cells:
        lines = [GAP.join(row[i] for i in lead)]
        short: list[str] = []  # consecutive short columns share a line
        for i in rest:
            item = f"{columns[i].title}: {row[i]}"
            if not columns[i].wrap:
                short.append(item)
                continue
            lines.extend(_flow(short, width))
            lines.extend(_wrap(item, width))
            short = []
        lines.extend(_flow(short, width))
        out.print(Text("\n".join(lines)), soft_wrap=True)


def _flow(items: list[str], width: int, indent: str = GAP) -> list[str]:
    """Short `name: value` items, several to a line, never one split across lines."""
    lines: list[str] = []
    line = ""
    for item in items:
        candidate = f"{line}{GAP}{item}" if line else indent + item
        if line and cell_len(candidate) > width:
            lines.append(line)
            candidate = indent + item
        line = candidate
    return [*lines, line] if line else lines


def _wrap(text: str, width: int, indent: str = GAP) -> list[str]:
    """Free text wrapped at spaces under a hanging indent; a word longer than the line
    (a path) is folded, never cut."""
    hang = indent * 2
    lines: list[str] = []
    line = indent
    for word in text.split(" "):
        candidate = f"{line} {word}" if line.strip() else line + word
        if line.strip() and cell_len(candidate) > width:
            lines.append(line)
            candidate = hang + word
        while cell_len(candidate) > width > len(hang) + 1:
            lines.append(candidate[:width])
            candidate = hang + candidate[width:]
        line = candidate
    lines.append(line)
    return lines
