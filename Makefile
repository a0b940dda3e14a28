# One entry point for humans and CI (.ci/run calls `make test`).
#   make test       lints, Rust tests, wheel build, Python tests against the installed wheel
#   make generate   the main job: `eagle-io generate` on the embedded SmolLM2 + ShareGPT, verified, then reported
#                   ($(OUT)/report.html; OUT=runs/smollm2-sharegpt, ARGS="..." passes more generate options)
#   make bench      the benchmarks (benches/README.md holds the results)
#   make dev        editable build into .venv for quick iteration
#   make test-fast  the Python tests without the slow ones, against the editable build

PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
CARGO   ?= cargo
PYTEST_ARGS ?=
export CARGO_TERM_COLOR = never

.PHONY: venv chromium s3s-fs wheel install dev lint fmt test test-fast test-rust test-python stubtest fuzz-short generate bench \
	clean

# PyPI's only torch is the CUDA build: .venv takes 6.3 GiB, and a clean `make test` (wheels unpacked under $$TMPDIR,
# .venv, target/, pytest's temp files) peaked at 8.6 GiB of disk. Check the room first, so a full disk stops here
# with the figures instead of half way through with pip's ENOSPC.
define DISK_CHECK
import shutil, sys, tempfile
need = 12 * 2**30
for where in sorted({".", tempfile.gettempdir()}):
    free = shutil.disk_usage(where).free
    if free < need:
        sys.exit(f"make venv: only {free / 2**30:.1f} GiB free at {where}; installing needs about {need // 2**30} GiB")
endef
export DISK_CHECK

$(VENV)/.installed: requirements/dev.txt requirements/embedded.txt requirements/sglang.txt requirements/speculators.txt
	@$(PY) -c "$$DISK_CHECK"
	@$(MAKE) --no-print-directory chromium
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements/dev.txt
	$(VPY) -m pip install -q --no-deps -r requirements/embedded.txt
	$(VPY) -m pip install -q --no-deps -r requirements/sglang.txt
	$(VPY) -m pip install -q --no-deps -r requirements/speculators.txt
	touch $@

venv: $(VENV)/.installed

# The system step: headless Chromium (Debian's `chromium`), in which tests/test_report.py renders `eagle-io report`
# pages. Installed with apt when running as root; otherwise (or when apt fails) those tests skip, saying why.
chromium:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "apt-get install chromium (headless page rendering for tests/test_report.py)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium \
	    >/dev/null) || echo "make chromium: apt could not install chromium; the browser tests will skip"; \
	else echo "make chromium: chromium is absent and needs root + apt to install; the browser tests will skip"; fi

# The S3-compatible server that tests/test_object_store.py starts on 127.0.0.1: s3s-fs, a real S3 implementation
# over a directory (each subdirectory a bucket), built once per machine from crates.io into a cache outside the clone
# (a fresh clone on the same machine reuses it). A debug build: 1.6 min on 2 idle cores (release: 2.4 min), and the
# tests' objects are small (tests/test_object_store.py ran as fast against it).
S3S_FS_ROOT ?= $(HOME)/.cache/eagle-io/s3s-fs-0.14.0-debug
S3S_FS := $(S3S_FS_ROOT)/bin/s3s-fs
export EAGLE_IO_S3S_FS := $(S3S_FS)
$(S3S_FS):
	$(CARGO) install s3s-fs --version 0.14.0 --locked --features binary --debug --root $(S3S_FS_ROOT)
s3s-fs: $(S3S_FS)

# The wheel a user would `pip install`, built and installed into the venv (no Rust needed there) only when a source
# changed since: stamp files, so a second `make generate` or `make test` neither rebuilds nor reinstalls it (`make dev`
# replaces the installed wheel with an editable build, so it drops the install stamp).
WHEEL_SOURCES := $(shell find src python -name '*.rs' -o -name '*.py' -o -name '*.pyi' -o -name py.typed) \
	Cargo.toml Cargo.lock pyproject.toml README.md
dist/.built: $(VENV)/.installed $(WHEEL_SOURCES)
	rm -rf dist
	$(VENV)/bin/maturin build --release --strip -o dist
	touch $@
$(VENV)/.wheel-installed: dist/.built
	$(VPY) -m pip install -q --force-reinstall --no-deps dist/eagle_io-*.whl
	touch $@
wheel: dist/.built
install: $(VENV)/.wheel-installed

dev: venv
	rm -f $(VENV)/.wheel-installed
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release

fmt: venv
	$(CARGO) fmt
	$(VENV)/bin/ruff format python tests benches
	$(VENV)/bin/ruff check --fix python tests benches

lint: venv
	$(CARGO) fmt --check
	# --release: its build scripts (zstd-sys, aws-lc-sys: C compiles) are then reused by test-rust and the wheel
	$(CARGO) clippy --release --all-targets --features python -- -D warnings
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches

test-rust:
	$(CARGO) test --release

# The parser fuzz checks alone (they also run in test-rust); EAGLE_IO_FUZZ_CASES=N for a longer run.
fuzz-short:
	$(CARGO) test --release --test fuzz_parsers

stubtest: install
	cd tests && ../$(VPY) -m mypy.stubtest eagle_io._native

# Tests run from tests/ against the installed wheel, never the source tree, on two pytest-xdist workers (a whole file
# per worker, so module fixtures are built once; conftest.py hands out the files with slow tests first).
XDIST ?= -n 2 --dist loadfile
test-python: install s3s-fs
	cd tests && ../$(VPY) -m pytest -q -p no:cacheprovider $(XDIST) $(PYTEST_ARGS) .

test: lint test-rust stubtest test-python

# Quick iteration: the Python tests without the `slow` ones (the real model, full ShareGPT, SGLang engines), against
# an editable build. CI runs everything (`make test`).
test-fast: dev s3s-fs
	cd tests && ../$(VPY) -m pytest -q -p no:cacheprovider -m "not slow" $(XDIST) $(PYTEST_ARGS) .

# OUT: the dataset directory. A dataset already there is resumed, which needs the options it was captured with
# (generate says which differ before loading the model): pass another OUT=DIR to capture with other ARGS.
OUT ?= runs/smollm2-sharegpt
generate: install
	$(VENV)/bin/eagle-io generate --out $(OUT) --limit 100 --skip-bad-records --resume $(ARGS)
	$(VENV)/bin/eagle-io verify $(OUT)
	$(VENV)/bin/eagle-io report $(OUT) --out $(OUT)/report.html

bench: install
	$(VPY) benches/bench_codec.py

clean:
	rm -rf $(VENV) dist target runs
