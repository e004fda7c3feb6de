"""PyTorch DDP and FSDP2 behind DeepSpeed's engine surface, so the loop, timing and records are shared.

``TorchEngine`` answers what ``ds_bench.measure.loop`` asks of a DeepSpeed engine: ``engine(**batch)``
(forward), ``backward(loss)`` and ``step()`` once per micro-step (the optimizer steps only at the
gradient-accumulation boundary, as ``DeepSpeedEngine.step`` does), ``device``, and
``save_checkpoint`` / ``load_checkpoint`` with DeepSpeed's signatures, written with torch's
distributed checkpoint (``torch.distributed.checkpoint``: one ``__{rank}_0.distcp`` file per rank
plus ``.metadata``) and a ``latest`` file naming the newest tag, as DeepSpeed writes one.
What the config maps to is decided by ``ds_bench.engines.torch_settings``.
"""

from __future__ import annotations

import contextlib
import os
import pickle

import torch
import torch.distributed as dist

from ds_bench.engines.torch_settings import TorchSettings

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class TorchEngine:
    def __init__(self, module: torch.nn.Module, settings: TorchSettings, device: torch.device):
        from ds_bench.config.deepspeed.optim import scheduler_classes

        self.module, self.settings, self.device = module, settings, device
        self.optimizer = getattr(torch.optim, settings.optimizer)(module.parameters(), **settings.optimizer_params)
        self.lr_scheduler = (scheduler_classes()[settings.scheduler](self.optimizer, **settings.scheduler_params)
                             if settings.scheduler else None)
        self.scaler = _grad_scaler(settings, device)
        self.micro_steps = 0
        self.global_steps = 0
        self._grad_norm = None  # clip_grad_norm_'s total at the last optimizer step; None without clipping

    def __call__(self, *args, **kwargs):
        if self.settings.engine == "ddp":  # DDP decides in forward whether this backward all-reduces (its no_sync)
            self.module.require_backward_grad_sync = self.is_gradient_accumulation_boundary()
        with self._autocast():
            return self.module(*args, **kwargs)

    def _autocast(self):
        if self.settings.engine != "ddp" or self.settings.precision == "fp32":
            return contextlib.nullcontext()  # FSDP casts through its MixedPrecisionPolicy
        return torch.autocast(self.device.type, dtype=DTYPES[self.settings.precision])

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.settings.grad_accum == 0

    def backward(self, loss: torch.Tensor) -> None:
        if self.settings.engine == "fsdp":
            self.module.set_requires_gradient_sync(self.is_gradient_accumulation_boundary())
        if self.settings.grad_accum > 1:
            loss = loss / self.settings.grad_accum  # DeepSpeed's scale_wrt_gas
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self) -> None:
        boundary = self.is_gradient_accumulation_boundary()
        self.micro_steps += 1
        if not boundary:
            return
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.settings.gradient_clipping > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.settings.gradient_clipping)
            # FSDP's is a DTensor partial over the ranks: its full value costs one scalar all-reduce, every rank alike
            self._grad_norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.global_steps += 1

    def get_global_grad_norm(self):
        """The total gradient norm ``clip_grad_norm_`` returned at the last optimizer step (DeepSpeed's name);
        None without clipping (no norm is computed then)."""
        return self._grad_norm

    def save_checkpoint(self, save_dir: str, tag: str | None = None, client_state: dict | None = None) -> None:
        import torch.distributed.checkpoint as dcp

        tag = tag or f"global_step{self.global_steps}"
        dcp.save(self._state(client_state or {}), checkpoint_id=os.path.join(save_dir, tag))
        dist.barrier()
        if dist.get_rank() == 0:
            with open(os.path.join(save_dir, "latest"), "w") as f:
                f.write(tag)

    def load_checkpoint(self, load_dir: str, tag: str | None = None) -> tuple[str, dict]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        if tag is None:
            with open(os.path.join(load_dir, "latest")) as f:
                tag = f.read().strip()
        path = os.path.join(load_dir, tag)
        state = self._state({})
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        extra = pickle.loads(state["extra"])
        if self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(extra["scheduler"])
        if self.scaler is not None:
            self.scaler.load_state_dict(extra["scaler"])
        self.micro_steps, self.global_steps = extra["micro_steps"], extra["global_steps"]
        return path, extra["client_state"]

    def _state(self, client_state: dict) -> dict:
        """What a checkpoint holds: model and optimizer as torch's state_dict API shards them (FSDP:
        each rank its shards; DDP: one copy, deduplicated by the planner), and the small rest as one
        pickled leaf (DCP flattens nested dicts and loads only keys the loader already has, so a
        client state of unknown keys would come back empty)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.module, self.optimizer)
        extra = {"scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler else None,
                 "scaler": self.scaler.state_dict() if self.scaler else None,
                 "micro_steps": self.micro_steps, "global_steps": self.global_steps, "client_state": client_state}
        return {"model": model_state, "optimizer": optim_state, "extra": pickle.dumps(extra)}


def _grad_scaler(settings: TorchSettings, device: torch.device):
    if settings.precision != "fp16":
        return None
    if settings.engine == "fsdp":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type, **settings.loss_scale)
    return torch.amp.GradScaler(device.type, **settings.loss_scale)


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    model = model.to(device)
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def wrap_fsdp(model: torch.nn.Module, settings: TorchSettings, device: torch.device) -> torch.nn.Module:
    """``fully_shard`` each unit HuggingFace marks as not to be split (``_no_split_modules``: GPT-2's
    blocks, ResNet's conv layers), then the root, which keeps the rest (embeddings, head)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mixed = MixedPrecisionPolicy(param_dtype=DTYPES[settings.precision] if settings.precision != "fp32" else None,
                                 reduce_dtype=DTYPES[settings.reduce_precision] if settings.precision != "fp32" else None)
    options = {"reshard_after_forward": settings.reshard_after_forward, "mp_policy": mixed,
               "offload_policy": CPUOffloadPolicy() if settings.cpu_offload else OffloadPolicy()}
    if not settings.cpu_offload:
        model = model.to(device)
    for unit in shard_units(model):
        fully_shard(unit, **options)
    return fully_shard(model, **options)


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names and m is not model]
