"""Every relative link and image of the user docs (README.md, docs/*.md) names a file of the repository, and
every ``#anchor`` a heading of the page it points to (as GitHub spells heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where a link is a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`+[^`\n]*`+", "", text)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens, repeats -N."""
    seen: dict[str, int] = {}
    out = set()
    for line in re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for target in LINK.findall(prose(doc.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = unquote(target).partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            problems.append(f"{doc.relative_to(root)}: {target} -> no such file {path}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{doc.relative_to(root)}: {target} -> no heading #{anchor} in {path or doc.name}")
    return problems


def test_every_relative_link_of_the_docs_resolves():
    problems = [problem for doc in DOCS for problem in broken_links(doc)]
    assert not problems, "broken links in the docs (fix the path or the anchor):\n" + "\n".join(problems)


def test_the_checker_sees_a_broken_file_and_a_broken_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Fully-async training (`trainer.mode=fully_async`)\n")
    doc = tmp_path / "page.md"
    doc.write_text(
        "[ok](other.md#fully-async-training-trainermodefully_async) [gone](missing.md) "
        "[bad](other.md#nowhere) `[code](ignored.md)` [web](https://example.org/x)\n"
    )
    problems = broken_links(doc, root=tmp_path)
    assert problems == [
        "page.md: missing.md -> no such file missing.md",
        "page.md: other.md#nowhere -> no heading #nowhere in other.md",
    ]


def test_every_raw_result_is_linked_from_the_benchmarks_page():
    """A result file under docs/results/ that the benchmarks index does not name is a number nobody can find."""
    linked = {unquote(target) for target in LINK.findall(prose((ROOT / "docs" / "benchmarks.md").read_text()))}
    results = sorted(p.name + ("/" if p.is_dir() else "") for p in (ROOT / "docs" / "results").iterdir())
    missing = [name for name in results if f"results/{name}" not in linked]
    assert not missing, f"add these to the index of docs/benchmarks.md (what, command, page, raw JSON): {missing}"
