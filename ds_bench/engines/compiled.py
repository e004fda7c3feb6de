"""``--compile``: ``torch.compile`` applied the way each engine supports it.

- DeepSpeed: ``engine.compile()`` (``DeepSpeedEngine.compile``: ``module.compile`` with the accelerator's
  compile backend, or DeepCompile when the config's ``compile`` section enables it).
- DDP: the DDP module itself (``nn.Module.compile``), so dynamo's DDPOptimizer splits the graph at
  bucket boundaries and all-reduces still overlap backward (torch's DDP + compile recipe).
- FSDP2: the root module after ``fully_shard`` (torch's FSDP2 + compile recipe).

Compilation is lazy: it happens in the first step, inside the warm-up, where
``ds_bench.measure.compile_stats`` times it and counts graphs, breaks and recompilations.
"""

from __future__ import annotations

DEFAULT_BACKEND = "inductor"


def compiles(cfg, ds_cfg: dict) -> bool:
    """Whether a run compiles its model: ``--compile``, or its DeepSpeed config's ``compile.deepcompile``
    (``--deepcompile``, ``--sp-path autosp``: DeepSpeed's passes run inside ``engine.compile()``)."""
    return bool(cfg.compile or (ds_cfg.get("compile") or {}).get("deepcompile") is True)


def compile_engine(engine, engine_name: str) -> str:
    """Compile ``engine``'s model in place; the backend it compiles with."""
    if engine_name == "deepspeed":
        from deepspeed.accelerator import get_accelerator

        backend = get_accelerator().get_compile_backend()
        engine.compile(backend=backend)
        return backend
    engine.module.compile(backend=DEFAULT_BACKEND)
    return DEFAULT_BACKEND
