"""The moe workload's model, in one process: it is HF's Mixtral (and Qwen3-MoE), its parameter counts and its
FLOPs.

- DeepSpeed's MoE layer (``ds_bench.engines.moe_layer.to_moe_layers``, its expert-parallel group set as
  ``deepspeed.initialize`` sets it) in place of HF's sparse blocks gives HF's logits and gradients for the same
  weights at EP = 1: top-2 (DeepSpeed's ``top2gating``), top-3 (``topkgating``) and Qwen3-MoE's renormalised
  top-k. Its top-1 gate is not Mixtral's (why ``--top-k 1`` is refused on that path).
- The placed build (``MoEWorkload.place_experts`` + ``build_model``: HF's experts on the meta device, this
  rank's drawn by ``hf_init.draw_experts``) holds exactly the plain build's weights, each rank its slice of the experts.
- ``moe_shapes.param_count`` is HF's model for every size (built on the meta device); the active counts are
  the model cards'.
- ``moe_shapes.flops_per_token`` against torch's ``FlopCounterMode`` on a forward + backward: equal on HF's
  eager experts; DeepSpeed's layer computes more (``test_deepspeeds_layer_computes_its_padded_slots_too``).
"""

from __future__ import annotations

import copy
import dataclasses
import socket

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ds_bench.config.run_config import RunConfig
from ds_bench.engines import moe_layer
from ds_bench.engines.degrees import expert_parallel
from ds_bench.workloads import build_workload, moe_shapes
from ds_bench.workloads.moe import moe_config
from tests.conftest import REPO

CONFIG = str(REPO / "ds_configs" / "zero1.json")
QWEN3_SMALL = dataclasses.replace(moe_shapes.SHAPES["qwen3-30b-a3b"], n_layer=2, hidden=64, heads=4, kv_heads=2,
                                  head_dim=16, expert_intermediate=32, experts=8, top_k=4, vocab=1024)
"""Qwen3-MoE's architecture (q/k norms, renormalised top-k of many experts) at a test's size."""


def workload(monkeypatch=None, arch="mixtral", **kw):
    """The moe workload (tiny Mixtral, or ``QWEN3_SMALL`` standing in for the qwen3 size)."""
    size = "tiny"
    if arch == "qwen3_moe":
        monkeypatch.setitem(moe_shapes.SHAPES, "qwen3-30b-a3b", QWEN3_SMALL)
        size = "qwen3-30b-a3b"
    return build_workload(RunConfig(workload="moe", size=size, ds_config=CONFIG, seq_len=kw.pop("seq_len", 64), **kw))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def one_rank_group():
    """A 1-rank gloo process group, as a DeepSpeed rank has one (its MoE layer takes its expert-parallel group from
    it: ``MoE.set_deepspeed_parallelism``), put away afterwards: the process group destroyed, DeepSpeed's comm
    backend and expert groups back as they were, so no later test on this worker sees any."""
    import deepspeed
    import deepspeed.comm.comm as ds_comm
    from deepspeed.utils import groups

    with pytest.MonkeyPatch.context() as mp:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
               "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        for name, value in env.items():
            mp.setenv(name, value)
        mp.setattr(ds_comm, "cdb", None)
        for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS", "_EXPERT_DATA_PARALLEL_GROUP",
                     "_EXPERT_DATA_PARALLEL_GROUP_RANKS"):
            mp.setattr(groups, name, {})
        deepspeed.init_distributed("gloo", verbose=False)
        try:
            yield
        finally:
            torch.distributed.destroy_process_group()


def with_moe_layers(model, w, size=1, world=1, rank=0):
    """``model`` (a copy) with DeepSpeed's MoE layers, their groups set as ``deepspeed.initialize`` sets them."""
    model = copy.deepcopy(model)
    plan = expert_parallel.resolve(size, world, w.experts, w.router, expert_parallel.MOE_LAYER)
    blocks = moe_layer.to_moe_layers(model, plan, rank)
    assert len(blocks) == w.shape.n_layer
    for block in blocks:
        block.moe.set_deepspeed_parallelism()
    return model


def experts_of(block):
    """A MoEBlock's local experts' weights stacked as HF stacks them: (gate_up_proj, down_proj)."""
    local = block.moe.deepspeed_moe.experts.deepspeed_experts
    return (torch.stack([e.gate_up.weight for e in local]), torch.stack([e.down.weight for e in local]))


def ids(vocab, batch=2, seq=64, seed=0):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


# ---- 1. the model is really Mixtral -----------------------------------------------------------------------------

@pytest.mark.parametrize("arch,top_k", [("mixtral", 2), ("mixtral", 3), ("qwen3_moe", 4)],
                         ids=["mixtral-top2", "mixtral-top3", "qwen3-top4"])
def test_the_moe_layer_model_gives_hfs_logits_and_gradients(one_rank_group, monkeypatch, arch, top_k):
    """At EP = 1 the model ds_bench trains under DeepSpeed (HF's, its sparse blocks DeepSpeed MoE layers with
    the same router and expert weights) gives HF's logits and loss to fp32 rounding (measured: equal), and
    the same gradient for every weight, experts and router included: the routing (softmax, the k largest,
    renormalised), the experts' SwiGLU and the combine are Mixtral's / Qwen3-MoE's, in training too. HF's
    own blocks compute with their default ``grouped_mm`` experts."""
    w = workload(monkeypatch, arch, top_k=top_k)
    hf = w.build_model()
    assert type(hf).__name__ == {"mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[arch]
    ours = with_moe_layers(hf, w)
    assert not moe_layer.sparse_blocks(ours) and len(moe_layer.moe_blocks(ours)) == w.shape.n_layer
    batch = ids(w.shape.vocab)
    hf.eval(), ours.eval()
    with torch.no_grad():
        expected, got = hf(input_ids=batch).logits, ours(input_ids=batch).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)

    hf.train(), ours.train()
    hf_loss, our_loss = hf(input_ids=batch, labels=batch).loss, ours(input_ids=batch, labels=batch).loss
    assert float(our_loss.detach()) == pytest.approx(float(hf_loss.detach()), rel=1e-6)
    hf_loss.backward(), our_loss.backward()
    ours_grads = dict(ours.named_parameters())
    for name, p in hf.named_parameters():
        if ".mlp." not in name:
            torch.testing.assert_close(ours_grads[name].grad, p.grad, rtol=1e-4, atol=1e-7, msg=name)
    for (_, _, block), moe in zip(moe_layer.sparse_blocks(hf), moe_layer.moe_blocks(ours)):
        torch.testing.assert_close(moe.moe.deepspeed_moe.gate.wg.weight.grad, block.gate.weight.grad,
                                   rtol=1e-4, atol=1e-7)
        local = moe.moe.deepspeed_moe.experts.deepspeed_experts
        for mine, theirs in ((torch.stack([e.gate_up.weight.grad for e in local]), block.experts.gate_up_proj.grad),
                             (torch.stack([e.down.weight.grad for e in local]), block.experts.down_proj.grad)):
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("size,rank", [(2, 0), (2, 1), (4, 3)], ids=["ep2-rank0", "ep2-rank1", "ep4-rank3"])
def test_a_placed_rank_holds_its_slice_of_the_plain_builds_experts(monkeypatch, size, rank):
    """``place_experts`` + ``build_model`` (what a rank of an ``--expert-parallel`` run builds): HF's stacked
    experts never leave the meta device, every other weight is the plain build's, and the rank's local experts
    are slice [first, first + E/EP) of the plain build's ``gate_up_proj`` / ``down_proj`` (``hf_init.draw_experts``
    draws what ``hf_init.initialize`` writes): every layout starts from the same model."""
    plain_w = workload(monkeypatch)
    plain = plain_w.build_model()
    placed_w = workload(monkeypatch)
    plan = expert_parallel.resolve(size, size, placed_w.experts, placed_w.router, expert_parallel.MOE_LAYER)
    seen = []
    convert = moe_layer.to_moe_layers

    def spy(model, *args, **kwargs):
        seen.extend(p.is_meta for _, _, b in moe_layer.sparse_blocks(model) for p in b.experts.parameters())
        return convert(model, *args, **kwargs)

    monkeypatch.setattr(moe_layer, "to_moe_layers", spy)
    placed_w.place_experts(plan, rank)
    placed = placed_w.build_model()
    assert seen and all(seen), "HF's stacked experts were allocated before the rank's own were drawn"
    assert not any(p.is_meta for p in placed.parameters())

    placed_params = dict(placed.named_parameters())
    for name, p in plain.named_parameters():
        if ".mlp." not in name:
            assert torch.equal(placed_params[name], p), name
    first, local = plan.first_expert(rank), plan.local_experts
    assert (first, local) == (rank * 4 // size, 4 // size)
    for (_, _, block), moe in zip(moe_layer.sparse_blocks(plain), moe_layer.moe_blocks(placed)):
        assert torch.equal(moe.moe.deepspeed_moe.gate.wg.weight, block.gate.weight)
        gate_up, down = experts_of(moe)
        assert gate_up.shape[0] == local
        assert torch.equal(gate_up, block.experts.gate_up_proj[first:first + local])
        assert torch.equal(down, block.experts.down_proj[first:first + local])
    held = moe_layer.params_held(placed, torch.Tensor.numel)
    assert held["experts"] == moe_shapes.expert_param_count(placed_w.shape) // size
    assert moe_layer.whole_model_params(placed, plan, torch.Tensor.numel) == moe_shapes.param_count(placed_w.shape)


def test_deepspeeds_top1_gate_is_not_mixtrals(monkeypatch):
    """Why ``--top-k 1`` is refused on the MoE-layer path: Mixtral's top-1 renormalises the one weight to 1,
    so a block's output is its expert's; DeepSpeed's ``top1gating`` weighs it by the gate probability, so its
    output is HF's x p (the largest softmax probability, < 1 with 4 experts)."""
    w = workload(monkeypatch)
    hf = w.build_model()
    block = hf.model.layers[0].mlp
    block.top_k = block.gate.top_k = 1
    plan = expert_parallel.ExpertParallelPlan(1, 1, w.experts, expert_parallel.Router(1))
    ours = moe_layer.MoEBlock(block, plan, 0)
    x = torch.randn(2, 16, w.shape.hidden, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = block(x), ours(x)
        p = torch.softmax(x.reshape(-1, w.shape.hidden) @ block.gate.weight.T, dim=-1).max(dim=-1).values
    assert float((got - expected).abs().max()) > 1e-3  # not Mixtral's
    torch.testing.assert_close(got.reshape(-1, w.shape.hidden), expected.reshape(-1, w.shape.hidden) * p[:, None],
                               rtol=1e-5, atol=1e-6)


# ---- 2. parameter counts ----------------------------------------------------------------------------------------

def meta_model(shape):
    from transformers import MixtralForCausalLM, Qwen3MoeForCausalLM

    with torch.device("meta"):
        return {"mixtral": MixtralForCausalLM, "qwen3_moe": Qwen3MoeForCausalLM}[shape.arch](moe_config(shape, 1024))


@pytest.mark.parametrize("size", sorted(moe_shapes.SHAPES))
def test_the_parameter_counts_are_the_hf_models(size):
    """``param_count``, ``expert_param_count`` and the 6 N term's ``active_matmul_params`` of every size against
    HF's model of that shape (on the meta device: no memory): every parameter, the experts' (the stacked
    ``gate_up_proj`` / ``down_proj``), and every weight a token multiplies (all but the embedding and the norms,
    k of the E experts)."""
    shape = moe_shapes.SHAPES[size]
    model = meta_model(shape)
    params = dict(model.named_parameters())
    assert sum(p.numel() for p in params.values()) == moe_shapes.param_count(shape)
    experts = sum(p.numel() for n, p in params.items() if ".experts." in n)
    assert experts == moe_shapes.expert_param_count(shape)
    unused = experts * (shape.experts - shape.top_k) // shape.experts
    assert moe_shapes.active_param_count(shape) == moe_shapes.param_count(shape) - unused
    not_multiplied = sum(p.numel() for n, p in params.items() if "embed_tokens" in n or "norm" in n)
    assert moe_shapes.active_matmul_params(shape) == moe_shapes.param_count(shape) - unused - not_multiplied


MODEL_CARDS = {"mixtral-8x7b": (46.7e9, 12.9e9), "mixtral-8x22b": (141e9, 39e9), "qwen3-30b-a3b": (30.5e9, 3.3e9)}
"""Total and active parameters the published models state (Mistral's announcements, Qwen3's model card)."""


@pytest.mark.parametrize("size", sorted(MODEL_CARDS))
def test_the_published_sizes_have_the_model_cards_counts(size):
    total, active = MODEL_CARDS[size]
    shape = moe_shapes.SHAPES[size]
    assert moe_shapes.param_count(shape) == pytest.approx(total, rel=0.01)
    assert moe_shapes.active_param_count(shape) == pytest.approx(active, rel=0.02)


# ---- 3. FLOPs ---------------------------------------------------------------------------------------------------

def counted(w, model, batch) -> FlopCounterMode:
    """torch's count of one training forward + backward (through torch's math attention kernel: the fused CPU
    one has no formula in the counter; tests/test_flops.py)."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        w.loss(model, batch).backward()
    return counter


def test_the_flops_formula_is_hfs_eager_experts_work_exactly():
    """HF's blocks (what DDP and FSDP train) with eager experts: the counter equals 6 N_active + 12 L H Q T,
    the k chosen experts per token, router, attention and head. Under HF's default ``grouped_mm`` experts the
    counter sees no expert FLOPs at all (no formula for ``aten._grouped_mm``), i.e. the formula less the k
    experts' 6 x 3 d f per token (checked last, so a torch that counts it shows up here)."""
    w = build_workload(RunConfig(workload="moe", size="tiny", ds_config=CONFIG, seq_len=64, engine="ddp"))
    torch.manual_seed(0)
    model = w.build_model()
    batch = next(iter(w.batches(0, 1, 2)))
    formula = 2 * w.model_flops_per_sample(model)
    model.config._experts_implementation = "eager"
    assert counted(w, model, batch).get_total_flops() == pytest.approx(formula, rel=1e-9)
    model.config._experts_implementation = "grouped_mm"
    s = w.shape
    experts = 2 * 64 * 6 * s.top_k * moe_shapes.expert_params(s) * s.n_layer
    assert counted(w, model, batch).get_total_flops() == pytest.approx(formula - experts, rel=1e-9), (
        "torch's counter now counts HF's grouped_mm experts: say so here")


@pytest.mark.parametrize("top_k", [2, 3])
def test_deepspeeds_layer_computes_its_padded_slots_too(monkeypatch, top_k):
    """DeepSpeed's MoE layer without token dropping pads every expert's tokens to the busiest expert's count C
    (``top2gating`` / ``topkgating``: capacity = max(exp_counts)) and runs each expert on all C slots, zeros
    included: per block 6 x 3 d f x (E x C - k x T) FLOPs more than the k x T routes the formula counts
    (useful work: model FLOPs, as MFU needs). Top-2 adds its gate's two ``einsum('se,se->s')`` (batched
    matmuls, 8 T E FLOPs forward + backward). The counter equals the formula + exactly those. At top-2 here
    (128 tokens, 64 routes per expert on average) the busiest experts got 73 and 79: 14% and 23% more expert
    FLOPs than the routes need, real work the record's hardware FLOPs (HFU) do not count either."""
    w = workload(monkeypatch, top_k=top_k)
    w.place_experts(expert_parallel.resolve(1, 1, w.experts, w.router, expert_parallel.MOE_LAYER), 0)
    torch.manual_seed(0)
    model = w.build_model()
    batch = next(iter(w.batches(0, 1, 2)))
    tokens = batch["input_ids"].numel()
    counter = counted(w, model, batch)
    s = w.shape
    blocks = moe_layer.moe_blocks(model)
    assert all(len(b.counts) == 1 and int(b.counts[0].sum()) == s.top_k * tokens for b in blocks)
    slots = [s.experts * int(b.counts[0].max()) for b in blocks]
    padding = sum(6 * moe_shapes.expert_params(s) * (c - s.top_k * tokens) for c in slots)
    gate_einsums = 8 * tokens * s.experts * s.n_layer if top_k == 2 else 0
    formula = 2 * w.model_flops_per_sample(model)
    assert padding > 0
    assert counter.get_total_flops() == pytest.approx(formula + padding + gate_einsums, rel=1e-9)
