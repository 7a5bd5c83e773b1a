# The two commands the README promises: `make demo` and `make test`. Both
# install what is missing first (Python venv, Go-built control plane, cached
# under ~/.cache/kmodkit) and print progress while they build or wait.

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | md5sum | cut -c1-12)

.PHONY: setup system-deps devcluster-bin lint test unit demo crds bench clean

system-deps:
	@command -v go >/dev/null || { echo "Go 1.26 is required to build the local control plane" >&2; exit 1; }
	@missing=""; for c in openssl; do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	if [ -n "$$missing" ]; then echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

$(STAMP): pyproject.toml
	@echo "setup: Python environment in $(VENV)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/pip install -q --upgrade pip
	@$(BIN)/pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

setup: system-deps $(STAMP)

devcluster-bin: setup
	@$(BIN)/python -m devcluster.build etcd kubernetes kwok registry helm

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest tests/unit tests/node -q

test: devcluster-bin lint
	$(BIN)/pytest -ra

demo: setup
	@$(BIN)/python -m devcluster.demo

bench: devcluster-bin
	@$(BIN)/python -m tests.bench.run

crds: setup
	@$(BIN)/kmodkit crds --out crds

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
