# make reproduce: regenerate and check every document number (results/), and docs/claims.md from the ledger.
# make test: the test suite, on two worker processes (pytest-xdist); it builds no engine environment: a live engine
# test runs only where its environment is already built, and the last line counts those left out. Both create .venv
# and install the pinned versions first.
# The install writes no bytecode (--no-compile): Python caches each module's the first time it is imported, which
# on 2 cores is about 45 s of CPU less than compiling every file of torch, jax and transformers up front.
# make test-engines: the live engine and training-route tests, each engine environment they need built first
# (under ~/.cache/softcapgrad/engines, two at a time).
# make census: every soft-cap and gate of the installed transformers, found by running each model type tiny
# (results/census.json, census.md, figures/census.png; about 700 s of CPU on a 2-core CPU without bf16 instructions,
# shared by up to 4 worker processes: 6 min on the wall; each model type's budget is CPU time; not part of make test).
# make experiment: does the bf16 dead zone cost training steps (results/experiment.json, experiment.md,
# figures/experiment.png; tiny Gemma 2 on one CPU thread; not part of make test).
# make parity: the caps of every capped model type through every engine, each engine from a virtual environment of
# its own built on first use under ~/.cache/softcapgrad/engines (softcapgrad engines lists them); results/parity.json,
# parity.md, figures/parity.png. The first run builds every environment (llama.cpp compiles from source).
# make train-parity: one training step per route (transformers' Trainer at its defaults, fp32 and bf16=True, default
# and eager attention, and a plain loss.backward(); peft LoRA and trl's SFTTrainer at their defaults; Cut
# Cross-Entropy and Liger-Kernel's fused losses) on parity's tiny models, in the main environment and in the
# transformers-4, transformers-5.0, train-peft, train-kerashub, train-fused, train-unsloth, train-axolotl,
# train-easydel and train-penzai environments, built first where missing, and torchtune's, LitGPT's and mlx-lm's own
# code in their parity environments: results/train-parity.json, .md.
# make page: the results as a static page (results/page/index.html and its assets; opens from file://), built from
# the committed parity.json, train-parity.json and default-attention.json. make page-screenshot also runs its browser
# test (headless Chromium: Debian's chromium and chromium-driver) and keeps results/figures/page.png.
# make default-attention: transformers' default attention on Gemma 2 release by release, bisected (a light
# environment per release under ~/.cache/softcapgrad/releases, reusing this torch); results/default-attention.json, .md.
# make incidents: the public soft-cap incidents, each replayed on its release before and after the fix where the tool
# reaches it (the light release environments built first where missing), judged caught or missed:
# results/incidents.json, .md.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

PARITY_TYPES := gemma2 gemma2+qpas gemma3_text gemma3_text+attention vaultgemma gemma3n_text gemma4_text gemma4_unified_text \
	recurrent_gemma nanochat beam xlstm inkling2_text inkling2_loop_text

.PHONY: install reproduce test test-engines bench census experiment parity train-parity default-attention incidents page \
	page-screenshot clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -c constraints.txt -e '.[test,plot,hf,jax,mlx,browser]'
	touch $(STAMP)

reproduce: $(STAMP)
	$(PY) -m softcapgrad reproduce --out results
	$(PY) -c 'from softcapgrad.ledger import claims_doc; claims_doc.write("results/claims.json", "docs/claims.md")'

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=25

test-engines: $(STAMP)
	$(PY) -m pytest -q -n 2 --build-engines -m engine_environments --durations=25

census: $(STAMP)
	$(PY) -m softcapgrad census --out results

experiment: $(STAMP)
	$(PY) -m softcapgrad experiment --out results

parity: $(STAMP)
	$(PY) -m softcapgrad parity --install --engine all $(foreach t,$(PARITY_TYPES),--model-type $(t)) --timeout 600 --jobs 2 \
		--out results

train-parity: $(STAMP)
	$(PY) -m softcapgrad train-parity --install --jobs 2 --out results

default-attention: $(STAMP)
	$(PY) -m softcapgrad parity-releases --out results

incidents: $(STAMP)
	$(PY) -m softcapgrad incidents --install --out results

page: $(STAMP)
	$(PY) -m softcapgrad page --out results/page

page-screenshot: page
	SOFTCAPGRAD_PAGE_SCREENSHOT=results/figures/page.png $(PY) -m pytest -q tests/test_page.py

bench: $(STAMP)
	$(PY) benchmarks/bench.py

clean:
	rm -rf $(VENV) .pytest_cache
