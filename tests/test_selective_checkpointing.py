"""``--selective-checkpointing`` (``ds_bench.workloads.checkpoint_policy``): the policy keeps what ``perf.memory``
counts, every other matmul's output and the attention kernel's per block, and training is unchanged: the same
loss and gradients as full checkpointing (in-process, a tiny Llama and GPT-2)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy

from ds_bench.perf import shapes
from ds_bench.workloads import checkpoint_policy
from ds_bench.workloads.causal_lm import enable_checkpointing


def tiny(arch: str):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, use_cache=False,
                                            attn_implementation="sdpa"))
    return GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                                      attn_implementation="sdpa"))


def step(arch: str, selective: bool | None, monkeypatch=None, decisions=None):
    """Loss and gradients of one step with checkpointing off (None), full (False) or selective (True)."""
    if decisions is not None:
        make = checkpoint_policy.create_selective_checkpoint_contexts

        def logged(policy):
            def log(ctx, func, *args, **kwargs):
                decision = policy(ctx, func, *args, **kwargs)
                if not ctx.is_recompute and func in checkpoint_policy.SAVED:
                    decisions.append((func, decision))
                return decision
            return make(log)

        monkeypatch.setattr(checkpoint_policy, "create_selective_checkpoint_contexts", logged)
    torch.manual_seed(0)
    model = tiny(arch)
    model.train()
    if selective is not None:
        enable_checkpointing(model, selective)
    ids = torch.randint(0, 128, (2, 64), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_selective_checkpointing_trains_as_full_checkpointing_does(arch):
    full_loss, full_grads = step(arch, False)
    loss, grads = step(arch, True)
    assert loss == pytest.approx(float(full_loss), rel=1e-6)
    for name, g in full_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("arch,matmuls", [("llama", 7), ("gpt2", 4)])
def test_the_policy_saves_every_other_matmul_and_the_attention_as_the_memory_model_counts(arch, matmuls, monkeypatch):
    """Per block: Llama's q, k, v, o, gate, up, down (7 matmuls: the 1st, 3rd, 5th, 7th kept: q, v, gate, down),
    GPT-2's qkv, its projection, the MLP's two (4: qkv and the first MLP projection kept); and the attention's
    output. ``Transformer.selective_saved_width`` counts those widths."""
    decisions: list = []
    step(arch, True, monkeypatch, decisions)
    kept = [d == CheckpointPolicy.MUST_SAVE for f, d in decisions if f in checkpoint_policy.MATMULS]
    assert kept == [i % 2 == 0 for i in range(matmuls)] * 2  # two blocks
    attention = [d for f, d in decisions if f not in checkpoint_policy.MATMULS]
    assert attention and all(d == CheckpointPolicy.MUST_SAVE for d in attention)
    shape = shapes.of_workload("llama", None, 2, 64, 4, 64) if arch == "llama" else None
    if shape is not None:  # Llama: input + down output (2 h) and q, v, gate, attention output
        assert shape.selective_saved_width() == 2 * 64 + 2 * 64 + shape.kv_width + shape.ffn
