# One command per job. `make demo` and `make test` work on a fresh Debian machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest docker image bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

# Docker: started here when absent (root, Debian); in CI a missing engine is fatal,
# elsewhere the Docker tests skip and say why.
docker:
	@bash scripts/docker-up.sh || [ -z "$$CI" ]

image: $(STAMP) docker
	$(BIN)/broker image build

demo: $(STAMP) docker
	$(BIN)/python scripts/demo.py

lint: $(STAMP)
	$(BIN)/ruff format --check broker effects tests scripts sandbox_images demo
	$(BIN)/ruff check broker effects tests scripts sandbox_images demo

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) docker
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
