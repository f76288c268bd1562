# One place for set-up, the main job and the tests. Each target is idempotent:
# the environment lives in .venv/ and is rebuilt only when the pins change.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
HOST   ?= 127.0.0.1
PORT   ?= 8000
STUDIES ?= sample-data
# The pinned OHIF viewer lives in the checkout (git-ignored) for `make ohif`, `make test` and `xflow ohif`.
export XFLOW_OHIF_DIR ?= $(CURDIR)/.ohif
# the server's logs, trained models and caches (xflow serve --workspace; gitignored)
WORKSPACE ?= xflow-workspace

.PHONY: setup run test lint bench clean ils-report dist

setup: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml requirements/constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24" "setuptools>=68" wheel
	# CPU torch first, from the local wheel (DESIGN §10); the constraints keep it.
	$(PY) -m pip install -q -c requirements/constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c requirements/constraints.txt -e '.[dev,train]'
	# monai/timm pull a CUDA torchvision that breaks `import peft` beside CPU torch.
	$(PY) -m pip uninstall -q -y torchvision || true
	touch $@

run: setup
	$(VENV)/bin/xflow serve --studies $(STUDIES) --workspace $(WORKSPACE) --host $(HOST) --port $(PORT)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# ruff (lint, 120 columns) over the whole tree and mypy over monailabel_xflow/ (core modules
# strict); both configured in pyproject.toml.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# reports/ils/recall.md + recall.json: report structuring P/R per field, pipeline recall per
# finding (Table 8 layout, default and halved thresholds) and mask IoU on a fresh phantom set.
ILS_SET ?= build/ils-phantoms
ils-report: setup
	rm -rf $(ILS_SET) build/ils-work
	$(VENV)/bin/xflow phantom --out $(ILS_SET) --count 200 --seed 1 --size 512
	$(VENV)/bin/xflow ils recall --images $(ILS_SET) --out reports/ils --work build/ils-work

# --- OHIF (issue 25) -------------------------------------------------------------------------
# The current OHIF viewer (@ohif/app, version and sha512 pinned in monailabel_xflow/commands/ohif.py),
# fetched once with npm into .ohif/ (git-ignored); `xflow ohif --studies URL` serves it, offline.
.PHONY: ohif
ohif: setup
	$(VENV)/bin/xflow ohif --install

# sdist + wheel into dist/ (python -m build; .ci/wheel-check installs the wheel in a fresh venv)
dist: setup
	rm -rf dist
	$(PY) -m build --outdir dist .

clean:
	rm -rf $(VENV)
