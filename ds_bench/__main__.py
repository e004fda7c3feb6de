"""``python -m ds_bench`` -> the ds-bench command line."""

from ds_bench.cli import entry

entry()
