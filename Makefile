# The two commands of the README. Each sets up .venv first (scripts/setup.sh).
.PHONY: setup run test

setup:
	@scripts/setup.sh

# The main job: the op benchmark on a GPU; without one, every op checked against its
# reference through Triton's interpreter.
run: setup
	.venv/bin/onetrip bench ops

test: setup
	.venv/bin/python -m pytest -q
