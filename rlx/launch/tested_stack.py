"""The GPU stack rlx's GPU suite ran with, and whether a node's installed packages are that stack.

``constraints/gpu.txt`` (beside the ``rlx`` package in a source checkout) pins the versions the suite ran
(``pip install -c constraints/gpu.txt 'rlx[gpu]'``). ``read_pins`` parses its ``name==version`` lines;
``stack_row`` is the text of ``rlx doctor``'s row for one node: matches, differs (each package with the tested
version), or, on a host without a GPU, that the pins do not apply. A stack that differs is reported, not
refused: newer vLLMs (the ``gpu-untested`` extra) may work, untested. Installing packages is left to pip.
"""

from __future__ import annotations

import re
from pathlib import Path

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints" / "gpu.txt"
INSTALL = "pip install -c constraints/gpu.txt 'rlx[gpu]'"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)")


def read_pins(path: Path | None = None) -> dict[str, str]:
    """Package name -> pinned version of each ``name==version`` line of ``path`` (default ``CONSTRAINTS``; {}
    when it is not there)."""
    path = path or CONSTRAINTS
    if not path.is_file():
        return {}
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if match := PIN.match(line.strip()):
            pins[match.group(1).lower()] = match.group(2)
    return pins


def installed_versions(names: list[str]) -> dict[str, str]:
    """The installed version of each package in ``names`` ("missing" where it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "missing"
    return found


def _same(installed: str, pinned: str) -> bool:
    """``installed`` satisfies ``==pinned`` (a local build tag such as +cu130 matches, as it does for pip)."""
    return installed.split("+", 1)[0] == pinned.split("+", 1)[0]


def stack_row(pins: dict[str, str], installed: dict[str, str], gpus: int) -> str:
    """What ``rlx doctor`` says of a node's packages against ``pins`` (the constraints file's)."""
    if not gpus:
        return "no GPU here: the tested GPU pins (constraints/gpu.txt) do not apply"
    if not pins:
        return f"no constraints file at {CONSTRAINTS} (an install from a wheel); rlx's source has constraints/gpu.txt"
    differs = [
        f"{name} {installed.get(name, 'missing')} (tested {pinned})"
        for name, pinned in pins.items()
        if not _same(installed.get(name, "missing"), pinned)
    ]
    if not differs:
        return "matches the tested GPU stack: " + ", ".join(f"{name} {version}" for name, version in pins.items())
    return f"differs from the tested GPU stack: {', '.join(differs)}; {INSTALL} installs what ran (untested otherwise)"
