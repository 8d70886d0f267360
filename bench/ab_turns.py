#!/usr/bin/env python3
"""Probe: two source trees of akter, sequential warm turns, run in alternating pairs.

    python bench/ab_turns.py --url URL --before REV --after REV [--pairs 10] [--turns 3000]

Each tree is exported from git (``git archive REV src``, so the working tree is left alone;
``--after .`` takes the working tree's ``src`` as it is) and ``bench/profile_turn.py
--no-profile`` runs once per tree per pair, alternately, each in a fresh process. On a VM whose
speed drifts from one minute to the next, the pair ratio (after / before, both measured within
seconds) is the figure to read: its median, and how many pairs the after tree won. Not a test.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_RESULT = re.compile(r"(\d+) µs client CPU per turn .*?, (\d+) turns/s")


def _tree(rev: str, into: Path) -> Path:
    if rev == ".":
        return ROOT / "src"
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def _run(src: Path, url: str, turns: int) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "profile_turn.py"), "--url", url,
         "--turns", str(turns), "--no-profile"],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
    ).stdout  # fmt: skip
    found = _RESULT.search(out)
    if found is None:
        raise SystemExit(f"no result in:\n{out}")
    return int(found.group(1)), int(found.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", required=True, help="PostgreSQL URL")
    parser.add_argument("--before", required=True, help="git revision of the first tree")
    parser.add_argument("--after", default=".", help="git revision, or . for the working tree")
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--turns", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = _tree(args.before, Path(tmp) / "before")
        after = _tree(args.after, Path(tmp) / "after")
        pairs: list[tuple[tuple[int, int], tuple[int, int]]] = []
        print("| pair | before: turns/s (client CPU µs) | after | after / before |")
        print("|---|---|---|---|")
        for number in range(1, args.pairs + 1):
            first = _run(before, args.url, args.turns)
            second = _run(after, args.url, args.turns)
            pairs.append((first, second))
            print(
                f"| {number} | {first[1]:,} ({first[0]}) | {second[1]:,} ({second[0]}) "
                f"| {second[1] / first[1]:.2f} |",
                flush=True,
            )
    ratios = [b[1] / a[1] for a, b in pairs]
    print(
        f"{args.before} -> {args.after}, {args.pairs} pairs of {args.turns} turns: "
        f"turns/s {statistics.median(a[1] for a, _ in pairs):,.0f} -> "
        f"{statistics.median(b[1] for _, b in pairs):,.0f} (medians), "
        f"client CPU {statistics.median(a[0] for a, _ in pairs):.0f} -> "
        f"{statistics.median(b[0] for _, b in pairs):.0f} µs; "
        f"pair ratio median {statistics.median(ratios):.2f}, "
        f"after won {sum(r > 1 for r in ratios)} of {len(ratios)}"
    )


if __name__ == "__main__":
    main()
