# Linkpack: every target installs what it needs into .venv from a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SHARED ?= ../shared
export LINKPACK_SHARED ?= $(abspath $(SHARED))

.PHONY: manifests demo test test-churn lint typecheck imports unit bench-placement bench-cluster bench-extender bench clean proto interposer image lock

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

proto: $(VENV)/.installed
	$(PY) -m node_agent.deviceplugin.build_proto

# The demo needs only Linkpack's runtime dependencies (the test tools come with `make test`).
$(VENV)/.runtime: pyproject.toml
	@if [ -f $(VENV)/.installed ] && [ $(VENV)/.installed -nt pyproject.toml ]; then touch $@; else \
		echo "make demo: installing Linkpack and its runtime dependencies into $(VENV) (first run only)"; \
		$(PYTHON) -m venv $(VENV) && $(PY) -m pip install --disable-pip-version-check -e . && touch $@; fi

demo: $(VENV)/.runtime
	$(PY) -m demo

# The C (C_SOURCES) against .clang-format; clang-format comes from the Debian package, installed with
# apt-get when missing (as root or through `sudo -n`, as tests/node/packages.py installs packages).
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@command -v clang-format >/dev/null || { s=$$([ "$$(id -u)" = 0 ] || echo sudo -n); \
		$$s $(CLANG_FORMAT_INSTALL) >/dev/null || { $$s apt-get update -qq && $$s $(CLANG_FORMAT_INSTALL); }; }
	clang-format --dry-run --Werror $(C_SOURCES)

typecheck: $(VENV)/.installed proto
	$(VENV)/bin/mypy topology contract extender node_agent kubectl_linkpack demo image_build

imports: $(VENV)/.installed
	$(VENV)/bin/lint-imports

test: $(VENV)/.installed proto lint typecheck imports
	$(PY) -m tests.cluster.binaries
	$(PY) -m tests.cluster.helm_binary
	$(PY) -m pytest -q

# One tier at a time (markers: tests/conftest.py); each test runs in exactly one of these, the
# real-GPU tests (-m gpu) in none. `make test` runs every tier.
.PHONY: test-unit test-cluster test-node test-image
test-unit: $(VENV)/.installed proto
	$(PY) -m tests.cluster.helm_binary
	$(PY) -m pytest -q -m unit

test-cluster: $(VENV)/.installed proto
	$(PY) -m tests.cluster.binaries
	$(PY) -m tests.cluster.helm_binary
	$(PY) -m pytest -q -m "cluster and not node"

# The real node (root) and the kubelet's own device manager.
test-node: $(VENV)/.installed proto
	$(PY) -m tests.cluster.binaries
	$(PY) -m pytest -q -m "node or kubelet"

test-image: $(VENV)/.installed proto
	$(PY) -m pytest -q -m "image and not node"

# The churn and fault run on the real node alone (root); `make test` runs it with everything else.
test-churn: $(VENV)/.installed proto
	$(PY) -m tests.cluster.binaries
	$(PY) -m pytest -q -m churn tests/node

# manifests/ rendered from the Helm chart (charts/linkpack), its one source; a test checks they match.
manifests: $(VENV)/.installed
	$(PY) -m tests.chart.render

bench-placement: $(VENV)/.installed
	$(PY) -m bench.placement

bench-cluster: $(VENV)/.installed
	$(PY) -m bench.cluster

bench-extender: $(VENV)/.installed proto
	$(PY) -m bench.extender
	$(PY) -m bench.scheduler_throughput

bench: bench-placement bench-cluster bench-extender

clean:
	rm -rf $(VENV) build node_agent/deviceplugin/_generated

# The CUDA driver-API interposer (LD_PRELOAD) for share containers; see node_agent/sharing/interposer/README.md.
INTERPOSER_SRC := $(wildcard node_agent/sharing/interposer/*.c)
# All the C, the interposer's and its tests' (fake driver, probe programs), for `make lint`.
C_SOURCES = $(wildcard node_agent/sharing/interposer/*.[ch] tests/interposer/*/*.[ch])
CLANG_FORMAT_INSTALL = env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang-format
INTERPOSER_BUILD ?= build/interposer
# glibc 2.34 folded libdl and libpthread into libc; naming their stubs (where this C library has them)
# keeps the library loadable in containers with an older glibc, where they are separate.
INTERPOSER_COMPAT = $(filter /%,$(shell $(CC) -print-file-name=libdl.so.2) $(shell $(CC) -print-file-name=libpthread.so.0))

interposer: $(INTERPOSER_BUILD)/liblinkpack_cuda.so

$(INTERPOSER_BUILD)/liblinkpack_cuda.so: $(INTERPOSER_SRC) $(wildcard node_agent/sharing/interposer/*.h)
	mkdir -p $(INTERPOSER_BUILD)
	$(CC) -O2 -fPIC -shared -Wall -Wextra -Werror -fvisibility=hidden -Wl,-Bsymbolic-functions \
		-Wl,-soname,liblinkpack_cuda.so -o $@ $(INTERPOSER_SRC) -Wl,--no-as-needed $(INTERPOSER_COMPAT) -ldl -lpthread

# The container image as an OCI archive, without any container registry (root, mmdebstrap; Debian
# packages and PyPI reachable): docs/operator-guide.md, "The container image". Cached by its
# inputs in $(LINKPACK_CACHE_DIR)/image (default ~/.cache/linkpack/image).
IMAGE_ARCHIVE ?= build/image/linkpack-0.1.0.oci.tar

image:
	$(PYTHON) -m image_build --out $(IMAGE_ARCHIVE)

# Regenerate the image's locks from pyproject.toml (runtime) and image_build/build-requirements.in
# (build tools, at the runtime lock's versions). Pins stay unless LOCK_UPGRADE=--upgrade.
LOCK_TOOLS := build/lock-tools
PIP_COMPILE = env -u PIP_FIND_LINKS CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_TOOLS)/bin/pip-compile --quiet --generate-hashes --strip-extras \
	--allow-unsafe --no-emit-index-url --no-emit-find-links $(LOCK_UPGRADE)

lock:
	$(PYTHON) -m venv $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/pip install -q pip-tools==7.6.2
	$(PIP_COMPILE) -o image_build/requirements.lock pyproject.toml
	grep -E '^[a-z0-9].*==' image_build/requirements.lock | sed 's/ .*//' > $(LOCK_TOOLS)/constraints.txt
	$(PIP_COMPILE) -c $(LOCK_TOOLS)/constraints.txt -o image_build/build-requirements.lock image_build/build-requirements.in
