"""``ds-bench schema``: print the JSON Schema of every record kind (``ds_bench.record.schema.json_schema``).

``docs/record.schema.json`` is its output (``ds-bench schema > docs/record.schema.json``; a test keeps
the two equal).
"""

from __future__ import annotations

import argparse
import json

from ds_bench.record.schema import json_schema


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No options: the schema of this version's records."""


def main(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return 0
