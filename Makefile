# Two commands on a fresh machine:
#   make app    set up .venv and start the app on the default model (ResNet-50)
#   make test   set up .venv (and Chromium for the browser test) and run every test
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: app test setup browser

$(BIN)/fusion-explorer: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

setup: $(BIN)/fusion-explorer

app: setup
	$(BIN)/fusion-explorer app

browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -q && apt-get install -y -q chromium)

test: setup browser
	$(BIN)/python -m pytest -q
