# One command per job. `make demo` and `make test` work on a fresh Debian machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest soak docker podman tools postgres image bench bench-native clean demo-fleet

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

# Podman, rootful and rootless (Debian's podman, catatonit, runc, uidmap; a containers.conf
# that works here; an unprivileged user with subuids): scripts/podman-up.sh says why.
# In CI a failure is fatal, elsewhere the Podman tests skip and say why.
podman:
	@bash scripts/podman-up.sh || [ -z "$$CI" ]

image: $(STAMP) docker
	$(BIN)/broker image build

demo: $(STAMP) docker
	$(BIN)/python scripts/demo.py

lint: $(STAMP)
	$(BIN)/ruff format --check broker effects tests scripts sandbox_images demo
	$(BIN)/ruff check broker effects tests scripts sandbox_images demo

typecheck: $(STAMP)
	$(BIN)/mypy

# Most tests wait (on a broker, a browser, PostgreSQL, Docker), so 4 workers keep two
# cores busy; each worker starts its own PostgreSQL and Chromium, and a file stays whole
# on one worker (loadfile). pytest caches its rewritten test modules as bytecode: with
# PYTHONDONTWRITEBYTECODE set, every run and every worker would rewrite all of them.
PYTEST_WORKERS ?= 4
pytest: $(STAMP) docker podman tools postgres
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n $(PYTEST_WORKERS) \
		--dist loadfile $(PYTEST_ARGS)

# The soak and flood variants (marked soak), at their long sizes (BROKER_SOAK=1): a
# burst of 100,000 requests, latency beside a flooding sandbox. Not part of `make test`.
soak: $(STAMP) docker podman tools postgres
	env -u PYTHONDONTWRITEBYTECODE BROKER_SOAK=1 $(BIN)/python -m pytest -m soak -n 2 \
		--timeout 3600 --session-timeout 7200 $(PYTEST_ARGS)

# PostgreSQL's server binaries (Debian's postgresql when absent, as root); nothing is
# started here: each test session, demo and bench starts its own server in a temp dir.
# In CI a failure is fatal, elsewhere the PostgreSQL tests skip and say why.
postgres:
	@bash scripts/postgres-up.sh || [ -z "$$CI" ]

# Real stand-ins the tests drive: Debian's Chromium (the inbox) and Prism serving
# GitHub's OpenAPI description; gcc and the headers the native prototype of bench/native
# builds with (tests/test_bench_native.py). Installed once; in CI a failure is fatal, elsewhere
# the tests that need them skip and say why.
tools:
	@bash scripts/prism-up.sh || [ -z "$$CI" ]
	@bash scripts/chromium-up.sh || [ -z "$$CI" ]
	@bash scripts/native-deps.sh || [ -z "$$CI" ]

# Lint first (a second) and the installs one at a time (apt takes one lock), then mypy
# beside pytest: most tests wait, so mypy's ~15 s of CPU fits in their idle time instead
# of before them. mypy prints once, at its end; pytest shows its progress as it goes.
test: lint docker podman tools postgres
	@$(MAKE) --no-print-directory -j2 typecheck pytest

# The benchmark against the raw inotify round trip (not part of `make test`; < 10 min).
# BENCH_ARGS=--quick for a < 2-minute run; rounds judged quiet or noisy: docs/performance.md.
bench: $(STAMP) docker postgres
	$(BIN)/python -m bench $(BENCH_ARGS)

# The C prototype of the accept path (bench/native/README.md) beside the durable floor
# and the broker, in judged rounds, then its instructions per request; not in `make bench`.
bench-native: $(STAMP)
	@bash scripts/native-deps.sh
	$(BIN)/python -m bench.native $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

.PHONY: prism demo-github

# Prism and GitHub's OpenAPI description (pinned, into .tools/prism/) for the GitHub
# handler's tests; CI runs it before pytest, elsewhere those tests skip and say so.
prism:
	bash scripts/prism-up.sh

# The GitHub pull-request path end to end on local stand-ins: a fake GitHub, a bare git
# remote, a broker, an agent (sandboxed when Docker answers), a person approving.
demo-github: $(STAMP) docker
	$(BIN)/python scripts/demo_github.py

.PHONY: demo-autogen

# AutoGen's CodeExecutorAgent with SandboxCodeExecutor and approval_func, driven by
# AutoGen's ReplayChatCompletionClient (no model, no network): one block approved and
# run in a sandbox, one denied with the reason back in the conversation.
demo-autogen: $(STAMP) docker
	$(BIN)/python scripts/demo_autogen.py

# Two brokers ("hosts" alpha and beta: separate state dirs and sandbox roots) on one
# PostgreSQL started for the demo; a request on each is approved from the other's CLI,
# then the fleet's audit chains are verified.
demo-fleet: $(STAMP) postgres
	$(BIN)/python scripts/demo_fleet.py
