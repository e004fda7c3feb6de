"""The parallel degrees at run time, one module each behind one protocol (``mesh.DegreePlan``): ``pipeline``,
``tensor_parallel`` (AutoTP), ``sequence_parallel`` (Ulysses), ``expert_parallel`` (the MoE layer, AutoEP) and
``data_parallel`` (the replicas the others leave), with ``moe_sequence_parallel`` (what experts and Ulysses need to
compose) and ``mesh`` (the run's active plans as one). Each module registers its resolver with the mesh on import,
in this order; what a degree is (flags, rules, key) is its module under ``ds_bench.config.degrees``."""

from ds_bench.engines.degrees import pipeline, tensor_parallel, sequence_parallel, expert_parallel  # noqa: F401,I001
