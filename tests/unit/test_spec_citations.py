"""Every section of the specification that a comment in ``src/`` cites exists in ``docs/spec/``.

Comments cite ``semantics §5.10`` (or a bare ``§5.10``), ``design §2.2``, ``evolution E3`` (or a
bare ``E3``), the workflows spec's ``W4`` and flow control's ``F2.9`` (docs/spec/index.md says
which page each names). A citation resolves when its page has the section (``§5.8.2``: section
5.8, whose numbered item 2 exists).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "docs" / "spec"
SOURCES = [p for p in sorted((ROOT / "src").rglob("*")) if p.suffix in {".py", ".sql"}]

_SECTION = re.compile(r"^#{1,4} .*\{ #(?P<anchor>[\w.]+) \}$", re.M)
_CITE = re.compile(
    r"(?P<design>design )?(?<![\w.])(?<!\d )§ ?(?P<number>\d+(?:\.\d+)*)"
    r"|(?<![\w-])(?P<letter>[EWFS])(?P<n>\d(?:\.\d+)*)\b"
)


def sections(page: Path) -> dict[str, str]:
    """Each anchored section of a spec page: anchor -> the text up to the next heading."""
    text = page.read_text("utf-8")
    found = list(_SECTION.finditer(text))
    return {
        m["anchor"]: text[m.end() : found[i + 1].start() if i + 1 < len(found) else None]
        for i, m in enumerate(found)
    }


def flow_control() -> dict[str, str]:
    text = (ROOT / "docs" / "flow-control.md").read_text("utf-8")
    found = list(re.finditer(r"^## (F\d+)\. .*$", text, re.M))
    return {
        m[1]: text[m.end() : found[i + 1].start() if i + 1 < len(found) else None]
        for i, m in enumerate(found)
    }


PAGES = {
    "semantics": sections(SPEC / "semantics.md"),
    "design": sections(SPEC / "design.md"),
    "E": sections(SPEC / "evolution.md"),
    "W": sections(SPEC / "workflows.md"),
    "F": flow_control(),
    "S": sections(SPEC / "subscriptions.md"),
}


def resolves(page: dict[str, str], prefix: str, parts: list[str]) -> bool:
    """The longest cited prefix is a section; at most one more part, a numbered item in it."""
    for cut in range(len(parts), 0, -1):
        anchor = prefix + ".".join(parts[:cut])
        if anchor in page:
            rest = parts[cut:]
            if not rest:
                return True
            # A numbered item: "2. ..." in a list, or "F2.9 ..." opening a paragraph.
            number = re.escape(rest[0])
            item = re.compile(rf"^\s*(?:{number}\.\s|{re.escape(anchor)}\.{number}\s)", re.M)
            return len(rest) == 1 and item.search(page[anchor]) is not None
    return False


def citations() -> list[tuple[str, str, str, list[str]]]:
    """(where, page, anchor prefix, number parts) of every citation in src/."""
    out = []
    for path in SOURCES:
        for lineno, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{lineno}"
            for m in _CITE.finditer(line):
                if m["number"]:
                    page = "design" if m["design"] else "semantics"
                    out.append((where, page, "s", m["number"].split(".")))
                else:
                    out.append((where, m["letter"], m["letter"], m["n"].split(".")))
    return out


def test_every_cited_section_exists() -> None:
    found = citations()
    assert len(found) > 150  # the scan sees the comments
    missing = [
        f"{where}: {page} {prefix}{'.'.join(parts)}"
        for where, page, prefix, parts in found
        if not resolves(PAGES[page], prefix, parts)
    ]
    assert missing == []


def test_the_pages_have_their_sections() -> None:
    assert {"s2.9", "s5.10", "s10.1"} <= PAGES["semantics"].keys()
    assert {f"E{i}" for i in range(1, 7)} <= PAGES["E"].keys()
    assert {f"W{i}" for i in range(1, 7)} <= PAGES["W"].keys()
    assert {f"S{i}" for i in range(1, 9)} <= PAGES["S"].keys()
    assert not resolves(PAGES["semantics"], "s", ["99"])
