# Two commands set everything up on a fresh machine (no root needed):
#   make demo   - create .venv, install, run the main job
#   make test   - create .venv, install everything (all extras + dev + docs), run the whole suite
#                 (it also builds the docs site with `mkdocs build --strict` and a wheel)
#   make compat - LangChain's, LangGraph's and crewAI's own test suites, unchanged and with
#                 the governor injected (sdists of the installed releases, cached in build/compat)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BASE_STAMP := $(VENV)/.stamp-base
ALL_STAMP  := $(VENV)/.stamp-all
COMPAT_STAMP := $(VENV)/.stamp-compat

.PHONY: demo test compat lint typecheck bench-hotpath clean

$(PY):
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "make demo / make test need Python >= 3.11 (langchain-core 1.8)"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(BASE_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[langchain,crewai]'
	@touch $@

$(ALL_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[all,dev,docs]'
	@touch $@ $(BASE_STAMP)

$(COMPAT_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[all,dev,docs,compat]'
	@touch $@ $(ALL_STAMP) $(BASE_STAMP)

demo: $(BASE_STAMP)
	$(VENV)/bin/loop-governor bench

test: $(ALL_STAMP)
	$(PY) -m pytest

compat: $(COMPAT_STAMP)
	$(PY) compat/run.py fetch
	$(PY) compat/run.py run

lint: $(ALL_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo

bench-hotpath: $(ALL_STAMP)
	$(PY) benchmarks/hotpath.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
