"""The "Upstream contract 2.3.0" table of the router page (docs/router.md, moved there from the
README), read back: (component, field, status) rows."""

from __future__ import annotations

from helpers import REPO

PAGE = REPO / "docs" / "router.md"
SECTION = "## Upstream contract 2.3.0"


def rows() -> list[tuple[str, str, str]]:
    """Every row, its component carried down from the row that names it."""
    text = PAGE.read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    out, component = [], ""
    for line in section.splitlines()[1:]:
        if not line.startswith("| ") or line.startswith("| component |"):
            continue
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        component = cells[0].strip("`") or component
        out.append((component, cells[1].strip("`"), cells[2]))
    return out


def absent() -> set[tuple[str, str]]:
    """(component, field) pairs the table says are absent here, one per name a row groups."""
    pairs = set()
    for component, field, status in rows():
        if status.startswith("absent ("):
            pairs |= {(c, f) for c in component.split(" / ") for f in field.split(", ")}
    return pairs
