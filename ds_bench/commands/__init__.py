"""One thin module per ds-bench command: ``add_arguments(parser)`` (its flags) and ``main(args) -> int``.

A command module imports only what its flags need (no torch, DeepSpeed, pydantic models or plotting at
import: ``tests/test_router_speed.py`` holds it to that); ``main`` imports the implementation when the
command runs. The router (``ds_bench.cli``) imports the chosen command's module only. Command modules
never import each other: two commands that need the same thing take it from the layer below.
"""
