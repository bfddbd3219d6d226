"""broker.errors is the one error tree: its docstring draws it as the classes are, and
every class in it is raised somewhere in broker/ or effects/."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from broker import errors

ROOT = Path(__file__).resolve().parents[1]
CLASSES = {
    name: cls
    for name, cls in vars(errors).items()
    if inspect.isclass(cls) and issubclass(cls, Exception) and cls.__module__ == errors.__name__
}


def drawn() -> dict[str, str | None]:
    """{class: its parent} as the module docstring draws the tree."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        found = re.match(r"^(\s*(?:[│ ]\s*)*(?:[├└]── )?)([A-Z]\w+)\s", line + " ")
        if not found or found.group(2) not in CLASSES:
            continue
        depth = len(found.group(1))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[found.group(2)] = stack[-1][1] if stack else None
        stack.append((depth, found.group(2)))
    return parents


def test_the_docstring_draws_every_class_under_its_parent() -> None:
    """Each exception class appears once in the drawn tree, under its real base."""
    real = {
        name: (cls.__bases__[0].__name__ if cls is not errors.BrokerError else None)
        for name, cls in CLASSES.items()
    }
    assert drawn() == real


def test_every_class_is_raised_somewhere() -> None:
    """A class is built outside errors.py (raised, or returned by a translator to be
    raised), or is the base of one that is: no class the code never raises."""
    sources = [
        p.read_text(encoding="utf-8")
        for folder in ("broker", "effects")
        for p in (ROOT / folder).rglob("*.py")
        if p != ROOT / "broker" / "errors.py"
    ]
    code = "\n".join(sources)
    built = {name for name in CLASSES if re.search(rf"(?<![\w.]){name}\(", code)}
    built |= {
        name
        for name, cls in CLASSES.items()
        if re.search(rf"^class \w+\((?:\w+\.)?{name}\)", code, re.M)
    }
    used = {
        name for name, cls in CLASSES.items() if any(issubclass(CLASSES[b], cls) for b in built)
    }
    assert set(CLASSES) - used == set()
