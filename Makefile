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

test: setup browser
	$(TEST_ENV) $(BIN)/python -m pytest -m "not duplicate" --durations=15

test-all: setup browser
	$(TEST_ENV) $(BIN)/python -m pytest --durations=15

# Every corpus entry through every source, hours on 2 cores (`make test` runs its CI subset only;
# FUSION_EXPLORER_CORPUS lifts the skip of the others): tests/test_corpus.py, README "Tests".
.PHONY: test-corpus
test-corpus: setup
	FUSION_EXPLORER_CORPUS=1 $(TEST_ENV) $(BIN)/python -m pytest -m corpus tests/test_corpus.py --durations=15
