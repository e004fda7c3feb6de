"""Sequence parallelism (``--sequence-parallel S``): DeepSpeed-Ulysses (ALST) shards every sequence over S ranks
and exchanges attention heads by all-to-all (llama; ``ds_bench.engines.degrees.sequence_parallel``), timed as
``sp_all_to_all``. Its own refusal: eager attention, whose 4-D mask Ulysses drops."""

from __future__ import annotations

from ds_bench.config.degrees.protocol import DEEPSPEED, Degree, DegreeRule, active


SEQUENCE = Degree(
    field="sequence_parallel", word="sp", flag="--sequence-parallel", metavar="S",
    help="shard every sequence over S ranks with DeepSpeed-Ulysses (ALST; llama, moe; sdpa or flash_attention_2): "
         "attention heads exchanged by all-to-all, data-parallel degree = world size / S, the S ranks of a group read "
         "the same batch. Default: none",
    what="DeepSpeed Ulysses sequence-parallel degree (llama, moe)", called="Ulysses", splits_replica=True,
    named="--sequence-parallel {sequence_parallel}",
    deepspeed_only="sequence parallelism is DeepSpeed-Ulysses here (--engine deepspeed)",
    deepspeed_only_source="ds_bench: DDP and FSDP are run without a sequence-parallel attention",
    divides_world="every data-parallel replica needs a whole sequence-parallel group",
    compile="not measured yet",
    divides_sequence=f"{DEEPSPEED}, ulysses_sp.py reshapes to [S, T/S, ...]",
    rules=(
        DegreeRule("Ulysses needs a causal kernel", lambda l, w: active("sequence_parallel", l, w) and l.attn == "eager",
                   "--attn eager with --sequence-parallel {sequence_parallel}: Ulysses drops the 4-D attention mask "
                   "eager needs (O(n^2) memory); use --attn sdpa or flash_attention_2",
                   f"{DEEPSPEED}, ulysses_sp.py register_with_transformers refuses eager",
                   {"sequence_parallel": 2, "attn": "eager"}),
    ),
    comm="sp_all_to_all",
)
