"""``ds-bench capacity --scale seq``'s flags, checked: the model whose longest sequence is searched (``--size`` of
``--workload gpt2|llama|moe``, or the base shape ``--layers/--hidden/--heads``) and its lengths (``--seq-len``, the
first probed; ``--max-seq-len``; ``--seq-granularity``: ``capacity.seq_search.Lengths``). ``--model PATH`` is not
a base yet: the memory prediction needs the model's shape and vocabulary before anything runs.
"""

from __future__ import annotations

import argparse

from ds_bench.capacity.family import Member, model_name, seq_member
from ds_bench.capacity.seq_search import Lengths
from ds_bench.errors import UserError

MAX_SEQ_LEN = 1_048_576
"""``--max-seq-len``'s default: 2^20 tokens."""
SEQ_GRANULARITY = 256
"""``--seq-granularity``'s default."""


def seq_family(args: argparse.Namespace, multiple: int, shape: tuple[int, int, int] | None,
               router: tuple = (None, None)) -> tuple[str, list[Member], dict]:
    """What the table says was searched, the model at the start length (the one member the spec keeps: its
    ``run_args`` name the model), and the spec's ``max_seq_len`` and ``seq_granularity``. ``multiple``: every
    length's divisor, the sequence-parallel degrees' least common multiple; ``shape``: the base shape, checked,
    or None; ``router``: a moe model's ``--experts`` / ``--top-k``."""
    from ds_bench.workloads import gpt2_shapes, llama_shapes, moe_shapes

    if args.size is None and shape is None:
        raise UserError("--scale seq needs the model: --size NAME, or --layers, --hidden and --heads (--model is not "
                        "a base of --scale seq yet)")
    if args.size is not None and shape is not None:
        raise UserError("--size and --layers/--hidden/--heads both name the model of --scale seq: give one")
    if args.size is not None:
        sizes = {"llama": llama_shapes.SHAPES, "moe": moe_shapes.SHAPES}.get(args.workload, gpt2_shapes.SHAPES)
        if args.size not in sizes:
            raise UserError(f"--size {args.size!r} is not a size of workload {args.workload}; known: "
                            f"{', '.join(sizes)}")
        model: tuple[str, ...] = ("--size", args.size)
    else:
        model = tuple(a for flag, v in zip(("--layers", "--hidden", "--heads"), shape) for a in (flag, str(v)))
    lengths = Lengths(args.seq_len, MAX_SEQ_LEN if args.max_seq_len is None else args.max_seq_len,
                      SEQ_GRANULARITY if args.seq_granularity is None else args.seq_granularity, multiple)
    if lengths.maximum < lengths.start:
        raise UserError(f"--max-seq-len {lengths.maximum} is below --seq-len {lengths.start}, the first length probed")
    if lengths.start % multiple:
        raise UserError(f"--seq-len {lengths.start} is not a multiple of {multiple} (the --sequence-parallel "
                        "degrees): every rank of a group holds an equal slice of each length probed")
    family = (f"longest sequence of {args.workload} {model_name(model)}: from {lengths.start}, doubled up to "
              f"{lengths.top}, bisected to {lengths.step}")
    return family, [seq_member(args.workload, model, lengths.start, router)], {"max_seq_len": lengths.maximum,
                                                                       "seq_granularity": lengths.granularity}
