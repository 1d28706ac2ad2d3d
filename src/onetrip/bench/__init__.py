"""The benchmark suites behind ``onetrip bench ...``.

    onetrip bench ops [--op NAME ...] [--dtype bf16] [--quick]    # fused ops vs their peers, in GB/s

``harness``: what every suite shares (device facts, the copy-bandwidth ceiling, timing
under CUDA graphs with a cold L2, result files, plots). ``cases``: the ops measured, as
data (shapes, inputs, bytes, providers). ``ops``: checks and times them. ``report``:
tables for people, one JSON line for scripts.
"""
