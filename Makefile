# The two commands the README promises: `make demo` and `make test`. Both
# install what is missing first (Python venv, Go-built control plane, cached
# under ~/.cache/kmodkit) and print progress while they build or wait.

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml devcluster/pyproject.toml agent/pyproject.toml | md5sum | cut -c1-12)

# busybox-static and tmux for the tests; mmdebstrap, buildah and skopeo make and
# push the product's images; containerd, runc, the CNI plugins, iptables and
# socat run the real node (the kernel tier's prepare.sh installs qemu itself), and
# git's daemon serves it sources.
DEBIAN_PACKAGES := busybox-static tmux mmdebstrap buildah skopeo containerd runc \
	containernetworking-plugins iptables socat git

.PHONY: setup system-deps devcluster-bin lint test unit demo crds krew bench clean

system-deps:
	@command -v go >/dev/null || { echo "Go 1.26 is required to build the local control plane" >&2; exit 1; }
	@missing=""; command -v openssl >/dev/null || missing="openssl"; \
	for pkg in $(DEBIAN_PACKAGES); do \
	  dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi
	@apt-cache show prometheus >/dev/null 2>&1 || { echo "updating the apt lists (promtool is fetched from Debian's prometheus package)"; apt-get update -qq; }

$(STAMP): pyproject.toml devcluster/pyproject.toml agent/pyproject.toml
	@echo "setup: Python environment in $(VENV)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/pip install -q --upgrade pip 'setuptools>=70.1'
	@$(BIN)/pip install -q -e '.[dev]' -e ./devcluster
	@rm -f $(VENV)/.installed-*; touch $@

setup: system-deps $(STAMP)

devcluster-bin: setup
	@$(BIN)/python -m kmodkit_dev.build etcd kubernetes kwok registry helm helm4 nfd promtool krew

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=tests/plugins/kmodkit-example $(BIN)/lint-imports
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest tests/unit tests/node tests/packaging -q

# The real-node and kernel tiers boot qemu VMs of one emulated CPU, which keep one core
# busy for half an hour while the other idles: they run in a pytest of their own beside
# the other tiers, their output kept in $(VM_LOG) and shown when both are done.
VM_TIERS := tests/realnode tests/kernel
VM_LOG := .state/vm-tiers.log
test: devcluster-bin lint
	@mkdir -p $(dir $(VM_LOG))
	@echo "test: $(VM_TIERS) run beside the other tiers (output: $(VM_LOG), shown at the end)"
	@$(BIN)/pytest -ra -p no:cacheprovider $(VM_TIERS) >$(VM_LOG) 2>&1 & vm=$$!; \
	$(BIN)/pytest -ra $(addprefix --ignore=,$(VM_TIERS)); rest=$$?; \
	wait $$vm; vm_rc=$$?; \
	echo "==== $(VM_TIERS), run beside the tiers above ===="; cat $(VM_LOG); \
	[ $$rest -eq 0 ] && [ $$vm_rc -eq 0 ]

demo: setup
	@$(BIN)/python -m kmodkit_dev.demo $(if $(REAL_NODE),--real-node)

bench: devcluster-bin
	@$(BIN)/python -m tests.bench.run

crds: setup
	@$(BIN)/kmodkit crds --out crds
	@$(BIN)/kmodkit crds --chart charts/kmodkit

# The archive krew/kmodkit.yaml names (its sha256 is in the manifest; tests/packaging checks it).
krew: setup
	@$(BIN)/python krew/archive.py dist

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
