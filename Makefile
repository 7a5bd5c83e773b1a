# The two commands the README promises: `make demo` and `make test`. Both
# install what is missing first (Python venv, Go-built control plane, cached
# under ~/.cache/kmodkit) and print progress while they build or wait.

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml devcluster/pyproject.toml agent/pyproject.toml | md5sum | cut -c1-12)

.PHONY: setup system-deps devcluster-bin lint test unit demo crds bench clean

system-deps:
	@command -v go >/dev/null || { echo "Go 1.26 is required to build the local control plane" >&2; exit 1; }
	@missing=""; command -v openssl >/dev/null || missing="openssl"; \
	dpkg -s busybox-static >/dev/null 2>&1 || missing="$$missing busybox-static"; \
	if [ -n "$$missing" ]; then echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

$(STAMP): pyproject.toml devcluster/pyproject.toml agent/pyproject.toml
	@echo "setup: Python environment in $(VENV)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/pip install -q --upgrade pip 'setuptools>=70.1'
	@$(BIN)/pip install -q -e '.[dev]' -e ./devcluster
	@rm -f $(VENV)/.installed-*; touch $@

setup: system-deps $(STAMP)

devcluster-bin: setup
	@$(BIN)/python -m kmodkit_dev.build etcd kubernetes kwok registry helm

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=tests/plugins/kmodkit-example $(BIN)/lint-imports
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest tests/unit tests/node tests/packaging -q

test: devcluster-bin lint
	$(BIN)/pytest -ra

# The one check that needs upstream KMM's own Module CRD (not run by `make test`: the Go
# module proxy refuses KMM, see docs/development.md). KMODKIT_KMM_CRDS is the
# config/crd/bases directory of a kernel-module-management checkout.
.PHONY: test-kmm
test-kmm:
	@test -n "$(KMODKIT_KMM_CRDS)" || { echo "test-kmm: set KMODKIT_KMM_CRDS to the config/crd/bases directory of a kernel-module-management checkout, e.g. make test-kmm KMODKIT_KMM_CRDS=../kernel-module-management/config/crd/bases (docs/development.md, KMM schema check)" >&2; exit 2; }
	@test -f "$(KMODKIT_KMM_CRDS)/kmm.sigs.x-k8s.io_modules.yaml" || { echo "test-kmm: $(KMODKIT_KMM_CRDS) has no kmm.sigs.x-k8s.io_modules.yaml; KMODKIT_KMM_CRDS must be KMM's config/crd/bases directory" >&2; exit 2; }
	@$(MAKE) --no-print-directory devcluster-bin
	KMODKIT_KMM_CRDS="$(abspath $(KMODKIT_KMM_CRDS))" $(BIN)/pytest tests/kmm -ra

demo: setup
	@$(BIN)/python -m kmodkit_dev.demo

bench: devcluster-bin
	@$(BIN)/python -m tests.bench.run

crds: setup
	@$(BIN)/kmodkit crds --out crds
	@$(BIN)/kmodkit crds --out charts/kmodkit/crds

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
