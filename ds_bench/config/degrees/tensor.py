"""Tensor parallelism (``--tensor-parallel T``): DeepSpeed AutoTP shards every layer over T ranks (llama;
``ds_bench.engines.degrees.tensor_parallel``). Its all-reduces are timed as ``tp_all_reduce``; ``plan`` keeps a group
inside one node."""

from __future__ import annotations

from ds_bench.config.degrees.protocol import Degree

TENSOR = Degree(
    field="tensor_parallel", word="tp", flag="--tensor-parallel", metavar="T",
    help="shard every layer over T ranks with DeepSpeed AutoTP (tensor_parallel.autotp_size; llama): data-parallel "
         "degree = world size / T, the T ranks of a group read the same batch. Default: none",
    what="DeepSpeed AutoTP degree (llama)", called="AutoTP", splits_replica=True, named="--tensor-parallel {tensor_parallel}",
    deepspeed_only="tensor parallelism is DeepSpeed's AutoTP here (--engine deepspeed)",
    deepspeed_only_source="ds_bench: DDP and FSDP are run without a TP plan",
    divides_world="every data-parallel replica needs a whole tensor-parallel group",
    compile="not measured yet (DeepSpeed has its own AutoTP compile pass)",
    comm="tp_all_reduce", candidates="node",
)
