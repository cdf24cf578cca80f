"""The slowest tests of a pytest run as a markdown table, read from the run's own output.

    .venv/bin/python -m pytest ... | tee run.log
    .venv/bin/python scripts/durations_table.py run.log [--top 25]

pytest prints its ``slowest N durations`` section in every rlx run (pyproject's ``--durations=25``); this reads
that section and prints one row per test phase: seconds, phase (setup, call, teardown) and the test's id.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROW = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*)$")


def slowest(text: str) -> list[tuple[float, str, str]]:
    """(seconds, phase, test id) of each row of the output's durations section, slowest first."""
    start = text.find("slowest ")
    if start < 0:
        raise SystemExit("no 'slowest N durations' section in this output: run pytest with --durations=N")
    rows = []
    for line in text[start:].splitlines()[1:]:
        match = ROW.match(line.strip())
        if match:
            rows.append((float(match[1]), match[2], match[3]))
        elif rows and line.startswith("="):
            break
    return sorted(rows, reverse=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="a file holding pytest's output")
    parser.add_argument("--top", type=int, default=25, help="how many rows to print")
    args = parser.parse_args(argv)
    rows = slowest(args.log.read_text(errors="replace"))[: args.top]
    print("| s | phase | test |\n|---:|---|---|")
    for seconds, phase, test in rows:
        print(f"| {seconds:.1f} | {phase} | `{test}` |")
    print(f"\n{len(rows)} rows, {sum(r[0] for r in rows):.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
