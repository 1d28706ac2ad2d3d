"""The sections of BENCHMARKS.md that ``tools/benchmarks_md.py`` writes, a module per group of suites.

Each module holds its sections' prose (method, peers, floor) as ``*_TEXT`` and a writer per suite,
``writer(gpu, data) -> markdown`` (or ``(gpu, runs)`` for a suite kept as several files) that builds
the tables from the curated results; ``common`` holds what they share: the results folder,
``load``, the run header and the table helpers.
"""
