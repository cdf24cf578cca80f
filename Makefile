# The two entry points of the README. Each creates or reuses .venv and installs what it needs.
# `make test PYTEST_ARGS=tests/sync` runs only tests/sync; PYTEST_ARGS holds pytest's own arguments (paths,
# -k, -m ...), and without a path pytest collects every test under tests/ (pyproject's testpaths).
PY ?= .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup quickstart test test-gpu test-docs lint

setup:
	@bash scripts/setup-venv.sh

quickstart: setup
	$(PY) -m rlx train configs/quickstart.yaml
	@echo "rlx is installed in .venv: run 'source .venv/bin/activate' to type 'rlx ...' as the README does"

# Two at a time by test file (pytest-xdist), then the tests marked serial one at a time; a selection with none of
# them (pytest's exit 5, nothing collected) passes the second phase.
test: setup
	$(PY) -m pytest -n 2 --dist loadfile --phase parallel $(PYTEST_ARGS)
	$(PY) -m pytest --phase serial $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The GPU suite (the tests marked gpu, from the files that hold them) on a CUDA host, in the Python that has rlx's gpu extra (`make test-gpu PY=python`
# where it is installed outside .venv); its report, with the GPU's name and the commit: docs/results/gpu_tests.json.
GPU_TESTS = $(shell grep -rl --include='*.py' 'mark.gpu' tests)
test-gpu:
	$(PY) -m pytest -m gpu --report-json docs/results/gpu_tests.json $(GPU_TESTS) $(PYTEST_ARGS)

# The linter and the formatter's check, as CI runs them before the tests (pyproject.toml says which rules and why).
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .


# The user docs' command blocks that take minutes (whole quickstarts), run as written; `make test` runs the rest.
test-docs: setup
	$(PY) -m pytest tests/docs -m docs_slow $(PYTEST_ARGS)
