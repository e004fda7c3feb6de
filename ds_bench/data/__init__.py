"""Readers for the data formats ds_bench accepts with ``--data PATH``."""
