"""The error reference has one anchor per reason: problem ``type`` URIs point at them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from akter.errors import Reason
from akter.http.problems import HTTP_STATUS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "errors.md"


def test_every_reason_has_its_anchor_and_status() -> None:
    text = PAGE.read_text("utf-8")
    anchors = re.findall(r"^## (\w+) \{ #(\w+) \}$", text, flags=re.M)
    assert all(title == anchor for title, anchor in anchors)
    assert {anchor for _, anchor in anchors} == {*get_args(Reason), "DeclaredError"}
    for reason in get_args(Reason):
        row = re.search(rf"^\| \[{reason}\]\(#{reason}\) \| (?P<status>[^|]+) \|", text, re.M)
        assert row is not None, reason
        assert str(HTTP_STATUS[reason]) in row["status"], reason
