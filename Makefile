# The two commands of the README. Each sets up .venv first (scripts/setup.sh).
.PHONY: setup run test test-all

setup:
	@scripts/setup.sh

# The main job: the demo (eager, fused, fused + CUDA graphs, profiled side by side); without
# a GPU, the tiny preset on the CPU with the kernels through Triton's interpreter.
run: setup
	.venv/bin/onetrip demo

test: setup
	.venv/bin/python -m pytest -q -n auto --durations=15 -m "not slow"

# Also the slow end-to-end checks (the CPU's two-rank bench and train checks), ~1 minute more.
test-all: setup
	.venv/bin/python -m pytest -q -n auto --durations=15
