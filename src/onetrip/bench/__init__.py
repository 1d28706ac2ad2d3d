"""The benchmark suites behind ``onetrip bench ...``.

    onetrip bench ops [--op NAME ...] [--dtype bf16] [--quick]    # fused ops vs their peers, in GB/s
    onetrip bench attention [--dtype bf16] [--quick]              # prefill attention vs SDPA, in TFLOP/s
    onetrip bench decode-attention [--quick]                      # decode attention, append_kv, in GB/s

``harness``: what every suite shares (device facts, the copy-bandwidth ceiling, timing
under CUDA graphs with a cold L2, peak memory, result files, plots). ``cases``: the ops
measured, as data (shapes, inputs, bytes, providers). ``ops``: checks and times them.
``attention`` and ``decode_attn``: the attention suites, each with its cells, providers,
summary and CPU check; ``providers``: the provider loop and output comparison they share.
``report``: tables for people, one JSON line for scripts.
"""
