# Two commands on a fresh machine:
#   make app    set up .venv and start the app on the default model (ResNet-50)
#   make test   set up .venv (and Chromium for the browser test) and run the tests (a line per file:
#               its time and peak memory; docs/test-suite.md)
#   make test-all  the same and the `duplicate` tests (larger copies of real-size ones)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: app test test-all setup browser

$(BIN)/fusion-explorer: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

setup: $(BIN)/fusion-explorer

app: setup
	$(BIN)/fusion-explorer app

# Chromium for the browser tests, and a CJK font: without one, Debian's chromium draws every Chinese
# string of the 中文 view as empty boxes (issue 26).
browser:
	@(command -v chromium >/dev/null 2>&1 && fc-list :lang=zh 2>/dev/null | grep -q .) || \
		(apt-get update -q && apt-get install -y -q chromium fonts-noto-cjk)

# One thread per process: the suite's tests (and the children they start) on a 2-core machine.
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# Two pytest-xdist workers, one per core. Each file runs whole on one worker (its module fixtures, the
# app a browser file starts, made once); the files are handed out longest first (tests/conftest.py,
# tests/file_seconds.tsv), not reordered by their number of tests. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
TEST_XDIST := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: setup browser
	$(TEST_ENV) $(BIN)/python -m pytest $(TEST_XDIST) -m "not duplicate" --durations=15

test-all: setup browser
	$(TEST_ENV) $(BIN)/python -m pytest $(TEST_XDIST) --durations=15

# Every corpus entry through every source, hours on 2 cores (`make test` runs its CI subset only;
# FUSION_EXPLORER_CORPUS lifts the skip of the others): tests/test_corpus.py, README "Tests". Each case is
# a child process of its own, so the cases (not the file) are spread over the workers.
.PHONY: test-corpus
test-corpus: setup
	FUSION_EXPLORER_CORPUS=1 $(TEST_ENV) $(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist load) -m corpus tests/test_corpus.py --durations=15
