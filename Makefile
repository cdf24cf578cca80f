# The two entry points of the README. Each creates or reuses .venv and installs what it needs.
PY := .venv/bin/python

.PHONY: setup quickstart test

setup:
	@bash scripts/setup-venv.sh

quickstart: setup
	$(PY) -m rlx train configs/quickstart.yaml

test: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)
