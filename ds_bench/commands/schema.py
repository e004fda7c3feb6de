"""``ds-bench schema``: print the JSON Schema of every record kind (``ds_bench.record.schema.json_schema``),
or with ``expect`` that of an expectations file (``ds_bench.record.expect_file.json_schema``).

``docs/record.schema.json`` and ``docs/expect.schema.json`` are their outputs (``ds-bench schema >
docs/record.schema.json``, ``ds-bench schema expect > docs/expect.schema.json``; a test keeps them equal).
"""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", nargs="?", choices=("record", "expect"), default="record",
                   help="record (default): a results file's line; expect: an expectations file (--expect FILE)")


def main(args: argparse.Namespace) -> int:
    if args.what == "expect":
        from ds_bench.record.expect_file import json_schema
    else:
        from ds_bench.record.schema import json_schema
    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return 0
