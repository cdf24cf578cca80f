"""The user docs as tests: every fenced shell block (```bash, ```sh or ```shell) of README.md and docs/*.md runs
as written, and a shell block under any other tag (```console, ```zsh ...) is an error: it would never run.

The blocks of a document run in its order, each as one `bash -e` script, in one scratch directory holding a
copy of what a clone gives a user (configs/, benchmarks/, docs/, scripts/, Makefile, README.md), with `rlx` and
`python` on PATH as this environment's (the code under test: the repository this file is in). A block passes
when every command in it exits 0 and nothing printed a traceback; whatever it started in the background is
ended with its process group.

A line that cannot run here is in SKIP with its reason (a GPU, a Ray cluster of several nodes, a run of many
minutes, the set-up that installs packages); `make quickstart` runs as the command its training half is
(STAND_INS). A block whose every line is skipped is reported skipped with the reasons. Blocks that take
minutes (a whole quickstart, the tools and distillation quickstarts, the OpenEnv run) carry the `docs_slow`
marker: the suite skips them unless the marker is selected, and `make test-docs` (pytest -m docs_slow) runs them.
Each of those entries, and each line skipped for taking minutes, says how long it takes (a test checks that). A
block that reads the quickstart's run (`runs/quickstart`) gets a 10-step quickstart first when the scratch
directory has none: the full one is a docs_slow block of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
USER_FILES = ("configs", "benchmarks", "docs", "scripts", "Makefile", "README.md", "pyproject.toml")
SHELL_FENCES = ("bash", "sh", "shell")
OTHER_SHELL_FENCES = ("console", "shell-session", "zsh", "fish", "ksh", "terminal")
"""Tags a reader takes for a shell and this runner does not run: the docs use ```bash instead."""
DURATION = re.compile(r"\b\d+(?:\.\d+)?\s*(?:s|min|minutes?)\b")

SKIP = [
    (r"make test\b", "the test suite itself: this runner is one of its tests"),
    (r"pip install\b", "installs packages over the network; the suite runs in the environment they made"),
    (
        r"rlx train configs/gsm8k_qwen2p5_0p5b\.yaml\b",
        "needs GPUs, and Qwen2.5-0.5B-Instruct and GSM8K from the Hub (or on disk), which this machine cannot reach",
    ),
    (r"rlx train CONFIG\b", "a template (CONFIG is the user's config) of a multi-GPU layout"),
    (r"rlx train configs/gpu_colocated_0p5b\.yaml\b", "needs a GPU (colocated engine and trainer)"),
    (r"python benchmarks/gpu_colocate\.py\b", "needs a GPU (measures device memory)"),
    (r"python benchmarks/bench_e2e\.py --workload (1gpu|2gpu)", "needs one or two GPUs (vLLM on both sides)"),
    (
        r"(export RAY_AUTH_MODE=|ray get-auth-token|ray start|ray job submit)\b",
        "needs a Ray cluster of several nodes (HEAD_IP); tests/launch/test_ray.py runs the launcher on a local one",
    ),
    (
        r"python benchmarks/bench_convert\.py\b",
        "a benchmark of minutes (about 5 min on 2 cores): writes and converts 1.7-4 GB checkpoints",
    ),
    (
        r"python benchmarks/bench_trace\.py\b",
        "a benchmark of minutes (the viewer part, 5 repeats: 117 s on 2 shared cores): opens a million-entry "
        "trace repeatedly",
    ),
    (
        r"rlx trace-view runs/quickstart\s*(#.*)?$",
        "opens the interactive viewer (a terminal and keys); the --summary / --export / --screenshot lines run it "
        "headless",
    ),
]
STAND_INS = [
    (
        r"make quickstart\b",
        "rlx train configs/quickstart.yaml",
        "its set-up half creates .venv with pip; its training half is this command",
    ),
]
QUICKSTART_TIME = "43 s on 2 shared cores, 99 s on the first run, which builds the model (results/quickstart_epyc.json)"
SLOW = [
    (
        r"rlx train configs/quickstart\.yaml(\s+trace\.enabled=true)?\s*(#.*)?$",
        f"the whole 60-step quickstart: {QUICKSTART_TIME}",
    ),
    (r"make quickstart\b", f"the whole 60-step quickstart: {QUICKSTART_TIME}"),
    (
        r"rlx train configs/quickstart_tools\.yaml\b",
        "the tools quickstart: a warm start and 30 two-turn steps, 69 s once the warm start is built "
        "(results/quickstart_tools_sync_vs_fully_async.json)",
    ),
    (
        r"rlx train configs/quickstart_distill\.yaml\b",
        "builds the student (about 1 min) and a teacher (1600 steps, about 3 min), then 30 steps (about 45 s): "
        "about 5 min on 2 shared cores (results/bench_distill_epyc*.json)",
    ),
    (
        r"rlx train configs/openenv_echo\.yaml\b",
        "the OpenEnv echo run: SmolLM2 imported, a vLLM server, 10 two-turn steps of about 67 s on 2 cores: "
        "about 11 min (docs/agents.md); 110 s a step on a busy VM",
    ),
]
QUICKSTART_RUN = "runs/quickstart"
PRELUDE = ["rlx", "train", "configs/quickstart.yaml", "trainer.total_steps=10", "logging.console=false"]
BLOCK_TIMEOUT_S = {False: 300, True: 1800}
"""A block's limit in s: 5 min, or 30 min for a docs_slow one (the OpenEnv run takes 11 min on a quiet 2-core VM)."""


@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    lines: list[str]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (line, reason)

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    def script(self) -> str:
        """The block as it runs: skipped lines become a no-op that says why, stand-ins replace their line."""
        out = []
        for line in self.lines:
            command = line.strip()
            if _match(SKIP, command) and not _in_heredoc(out):
                out.append(f": skipped here: {command[:60]!r}")
            elif _match(STAND_INS, command) and not _in_heredoc(out):
                out.append(next(new for pattern, new, _ in STAND_INS if re.match(pattern, command)))
            else:
                out.append(line)
        return "\n".join(out) + "\n"

    @property
    def runs_nothing(self) -> bool:
        commands = [line.strip() for line in self.lines if line.strip() and not line.strip().startswith("#")]
        return all(_match(SKIP, c) for c in commands)

    @property
    def slow(self) -> bool:
        return any(_match(SLOW, line.strip()) for line in self.lines)


def _match(table: list[tuple], command: str) -> str | None:
    """The reason of the first entry of ``table`` whose pattern matches the start of ``command``."""
    return next((entry[-1] for entry in table if re.match(entry[0], command)), None)


def _in_heredoc(lines_so_far: list[str]) -> bool:
    """Whether the next line is inside a here-document opened by an earlier line of the block."""
    terminator = None
    for line in lines_so_far:
        if terminator is not None:
            terminator = None if line.strip() == terminator else terminator
            continue
        opened = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        terminator = opened.group(1) if opened else None
    return terminator is not None


def shell_blocks(doc: Path) -> list[Block]:
    blocks, current = [], None
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        if current is None and line.strip() in {f"```{tag}" for tag in SHELL_FENCES}:
            current = Block(doc, number, [])
        elif current is not None and line.strip() == "```":
            current.skipped = [(c.strip(), _match(SKIP, c.strip())) for c in current.lines if _match(SKIP, c.strip())]
            blocks.append(current)
            current = None
        elif current is not None:
            current.lines.append(line)
    return blocks


BLOCKS = [block for doc in DOCS for block in shell_blocks(doc)]


def _param(block: Block):
    # a docs_slow block may run past the suite's per-test timeout (pyproject's 600 s): its own limit applies
    marks = [pytest.mark.docs_slow, pytest.mark.timeout(BLOCK_TIMEOUT_S[True] + 60)] if block.slow else []
    if block.runs_nothing:
        reasons = "; ".join(dict.fromkeys(reason for _, reason in block.skipped))
        marks.append(pytest.mark.skip(reason=f"every line is on the skip list: {reasons}"))
    return pytest.param(block, id=block.id, marks=marks)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> dict:
    """A clone's user-facing files, and a PATH whose `rlx` and `python` are this environment's, importing the
    code of this repository, followed by the environment's other scripts."""
    work = tmp_path_factory.mktemp("docs") / "clone"
    work.mkdir()
    for name in USER_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, work / name)
    bin_dir = work.parent / "bin"
    bin_dir.mkdir()
    for name, argv in (("rlx", f'"{sys.executable}" -m rlx'), ("python", f'"{sys.executable}"')):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = dict(
        os.environ,
        # then this environment's own scripts (openenv, uvicorn), as an activated venv has them
        PATH=os.pathsep.join((str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"])),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    )
    return {"dir": work, "env": env}


def run(argv: list[str], cwd: Path, env: dict, timeout_s: float) -> tuple[int, str]:
    """``argv`` in its own process group, which is ended afterwards (a block's background server with it)."""
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return -1, output + f"\n[runner] timed out after {timeout_s} s"
    finally:
        _end_group(proc.pid)
    return proc.returncode, output


def _end_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(pgid, signal.SIGKILL)


def ensure_quickstart_run(scratch: dict) -> None:
    """A quickstart run for the blocks that read one (the full run is a docs_slow block of its own)."""
    if (scratch["dir"] / QUICKSTART_RUN / "checkpoints").is_dir():
        return
    code, output = run(PRELUDE, scratch["dir"], scratch["env"], BLOCK_TIMEOUT_S[False])
    assert code == 0, f"the 10-step quickstart the blocks read failed:\n{output[-4000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_shell_block_runs_as_written(block: Block, scratch):
    script = block.script()
    trains_it = re.search(r"^rlx train configs/quickstart\.yaml\b", script, re.M)
    if QUICKSTART_RUN in script and not trains_it:
        ensure_quickstart_run(scratch)
    path = scratch["dir"].parent / f"block-{block.line}.sh"
    path.write_text(script)
    code, output = run(["bash", "-e", str(path)], scratch["dir"], scratch["env"], BLOCK_TIMEOUT_S[block.slow])
    shown = f"{block.id} ran as:\n{script}\n--- output (last 4000 characters) ---\n{output[-4000:]}"
    assert code == 0, shown
    assert "Traceback (most recent call last)" not in output, shown


def test_every_skip_and_stand_in_still_matches_a_line_of_the_docs():
    """An entry that matches nothing is stale: it would hide a command added later under the same words."""
    lines = [line.strip() for block in BLOCKS for line in block.lines]
    for entry in (*SKIP, *STAND_INS, *SLOW):
        assert any(re.match(entry[0], line) for line in lines), f"no shell line of the docs matches {entry[0]!r}"


def test_no_shell_block_hides_under_a_tag_the_runner_skips():
    """A ```console or ```zsh block would never run here: the docs spell every shell block ```bash (or sh)."""
    found = [
        f"{doc.relative_to(ROOT)}:{number}: {line.strip()}"
        for doc in DOCS
        for number, line in enumerate(doc.read_text().splitlines(), start=1)
        if line.strip().lower() in {f"```{tag}" for tag in OTHER_SHELL_FENCES}
    ]
    assert not found, "use ```bash for these blocks, so that they run as tests:\n" + "\n".join(found)


def test_every_long_command_says_how_long_it_takes():
    """The entries for blocks of minutes (docs_slow) and the lines skipped for taking minutes name their time."""
    long = [entry for entry in SLOW] + [entry for entry in SKIP if "minutes" in entry[-1]]
    missing = [entry[0] for entry in long if not DURATION.search(entry[-1])]
    assert not missing, f"say how long these take (e.g. 'about 3 min on 2 cores') in their reason: {missing}"


def test_every_shell_fence_is_found():
    """The sh block of docs/agents.md (the OpenEnv run) is one of the blocks, as every ```sh block is."""
    assert any(block.doc.name == "agents.md" and "openenv init echo_env" in block.lines for block in BLOCKS)


def test_the_runner_finds_the_blocks_and_keeps_heredocs_whole():
    """The README's blocks are found with their lines; a skipped command inside a here-document (python code
    that happens to start like one) is not touched."""
    assert len(BLOCKS) >= 10 and all(block.lines for block in BLOCKS)
    block = Block(ROOT / "README.md", 1, ["python - <<'EOF'", "make test = 1", "EOF", "make test"])
    assert block.script().splitlines() == ["python - <<'EOF'", "make test = 1", "EOF", ": skipped here: 'make test'"]
