# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean

install: $(STAMP)

# CPU torch first: a bare `torch` requirement would pull several GB of CUDA.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/evalq run examples/translation.json --out out/translation
	$(BIN)/evalq run examples/qa_dataset.json --out out/qa_dataset
	$(BIN)/python examples/run_rag_demo.py
	@echo "results: out/translation/, out/qa_dataset/, out/rag_qa/ and out/safety/ (results.json, log.jsonl, run.json)"

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/bench_cpu.py
	$(BIN)/python bench/bench_bertscore.py
	$(BIN)/python bench/bench_submit.py

clean:
	rm -rf $(VENV) out
