# The two commands of the README. Each sets up .venv first (scripts/setup.sh).
.PHONY: setup run test

setup:
	@scripts/setup.sh

# The main job: the demo (eager, fused, fused + CUDA graphs, profiled side by side); without
# a GPU, the tiny preset on the CPU with the kernels through Triton's interpreter.
run: setup
	.venv/bin/onetrip demo

test: setup
	.venv/bin/python -m pytest -q -n auto --durations=15
