# make reproduce: regenerate and check every document number (results/).
# make test: the test suite. Both create .venv and install the pinned versions first.
# make census: every soft-cap and gate of the installed transformers, found by running each model type tiny
# (results/census.json, census.md, figures/census.png; 2 to 3 minutes on one CPU core; not part of make test).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install reproduce test bench census clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,plot,hf,jax]'
	touch $(STAMP)

reproduce: $(STAMP)
	$(PY) -m softcapgrad reproduce --out results

test: $(STAMP)
	$(PY) -m pytest -q --durations=25

census: $(STAMP)
	$(PY) -m softcapgrad census --out results

bench: $(STAMP)
	$(PY) benchmarks/bench.py

clean:
	rm -rf $(VENV) .pytest_cache
