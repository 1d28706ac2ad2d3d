"""argparse ``type`` functions shared by the ``onetrip`` command's parsers (``cli.py``,
``cli_bench.py``): each parses a value and refuses it with what was expected."""

from __future__ import annotations

import argparse


def checked(parse, ok, expected: str):
    """An argparse ``type``: ``parse(text)``, kept when ``ok`` holds, else an error saying what is ``expected``."""
    def check(text: str):
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return check


# --bandwidth's value: a finite number of GB/s above 0
gbs = checked(float, lambda v: 0 < v < float("inf"), "GB/s as a number above 0 (e.g. 3350)")


positive = checked(int, lambda v: v >= 1, "an integer >= 1")
fraction = checked(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
port = checked(int, lambda v: 0 <= v <= 65535, "a port in [0, 65535] (0: any free one)")
