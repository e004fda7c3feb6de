"""Pipeline parallelism (``--pipeline-stages``): the GPT-2 pipeline layers against HF GPT-2, the layout
checks, the loop's per-step path, and real torchrun runs: P=2 on 2 ranks (one data-parallel replica) gives
the loss curve of P=1 on one rank at the same accumulation.

The reference is P=1 through the same ``PipelineModule`` path (``--pipeline-stages 1``), not the HF model
under ``deepspeed.initialize``: the question is whether splitting the model over stages changes the
training (activations sent between stages, the tied embedding/head gradients summed across stages and
applied once), and only the same module, same initialisation (``hf_init``: the plain model's) and the same
engine arithmetic (loss scaled by the accumulation, the mean over micro-batches) isolate that. That the
pipeline's layers compute HF GPT-2 itself is checked separately, in-process (weights copied, same loss).
"""

import logging
import math

import pytest
import torch

from ds_bench.engines.degrees import pipeline
from ds_bench.engines.degrees.mesh import Mesh
from ds_bench.errors import UserError
from ds_bench.measure.loop import LoopTimes, run_loop, timing
from tests.conftest import OFFLINE, degree, explain, records, run_cmd, size_of

SHAPE = ("--layers", "4", "--hidden", "64", "--heads", "4", "--seq-len", "32")
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_CBWR": "AUTO,STRICT"}
"""Every rank of every run single-threaded (torchrun sets this for 2 ranks, not for 1): the same matmul
reduction order on both sides of the comparison."""


# ---- the layers are HF GPT-2 --------------------------------------------------------------------

def test_pipeline_layers_compute_hf_gpt2():
    """The pipeline's layers, run in sequence with the HF model's weights copied in, give HF's loss."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from ds_bench.workloads import gpt2_pipe

    config = GPT2Config(vocab_size=97, n_positions=16, n_layer=3, n_embd=32, n_head=4, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(config).eval()
    layers = [spec.build() for spec in gpt2_pipe.layer_specs(config)]
    layers[0].weight.data.copy_(hf.transformer.wte.weight)
    layers[1].wpe.weight.data.copy_(hf.transformer.wpe.weight)
    for block, hf_block in zip(layers[2:-2], hf.transformer.h):
        block.load_state_dict(hf_block.state_dict())
    layers[-2].load_state_dict(hf.transformer.ln_f.state_dict())
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    hidden = ids
    for layer in layers[:-1]:
        hidden = layer(hidden)
    logits = gpt2_pipe.lm_logits(layers[0], hidden)  # the head is the input embedding, tied
    expected = hf(input_ids=ids, labels=ids)
    torch.testing.assert_close(logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gpt2_pipe.causal_lm_loss(logits, ids), expected.loss, rtol=1e-6, atol=1e-6)


def test_pipeline_blocks_are_initialised_as_hf_initialises_them():
    """HF GPT-2's distributions (``hf_init``); that they are the HF model's very weights: ``test_same_init``."""
    from transformers import GPT2Config

    from ds_bench.workloads import gpt2_pipe, hf_init

    config = GPT2Config(vocab_size=97, n_positions=16, n_layer=8, n_embd=256, n_head=4)
    stage = torch.nn.Module()
    stage.tied_modules = torch.nn.ModuleDict({"wte": gpt2_pipe.TokenEmbedding(97, 256)})
    stage.add_module("2", gpt2_pipe.GPT2BlockPipe(config, 0))
    hf_init.initialize(stage, 0, hf_init.gpt2_std(8), lambda name: gpt2_pipe.hf_name(name, 8))
    block = stage.get_submodule("2")
    assert block.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.mlp.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert stage.tied_modules.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.equal(block.ln_1.weight, torch.ones(256)) and not block.attn.c_attn.bias.any()


# ---- layout checks ----------------------------------------------------------------------------

def test_plan_layout_and_bubble():
    assert pipeline.resolve(None, None, 4, 12) is None
    plan = pipeline.resolve(2, None, 4, 12)
    assert (plan.stages, plan.data_parallel_size, plan.partition) == (2, 2, "parameters")
    cfg = {"gradient_accumulation_steps": 6, "zero_optimization": {"stage": 1}}
    plan = pipeline.with_micro_batches(plan, cfg)
    assert plan.micro_batches == 6 and plan.bubble() == pytest.approx(1 / 7)
    assert Mesh(4, (plan,)).data_parallel_size == 2
    assert plan.record_settings() == {"micro_batches": 6, "partition": "parameters",
                                      "schedule_bubble": pytest.approx(1 / 7)}


@pytest.mark.parametrize("stages, world, blocks, pattern", [
    (4, 4, 2, r"--pipeline-stages 4 is more than the model's 2 transformer blocks"),
    (1, 1, None, r"this workload has no pipeline model"),
])
def test_plan_refuses(stages, world, blocks, pattern):
    """What needs the model; the layouts a pipeline refuses are the legality table's (tests/test_legality.py)."""
    with pytest.raises(UserError, match=pattern):
        pipeline.resolve(stages, None, world, blocks)


def test_fewer_micro_batches_than_stages_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="ds_bench"):
        plan = pipeline.with_micro_batches(pipeline.resolve(4, None, 4, 8), {"gradient_accumulation_steps": 2})
    assert plan.micro_batches == 2
    assert "fewer micro-batches than stages, the pipeline bubble (60% of the step idle) dominates" in caplog.text


def test_clipping_counts_every_stage_once():
    """Each stage's own parameters marked model-parallel for DeepSpeed's clip_grad_norm_; a tied replica not."""
    owned, replica = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    owned.ds_pipe_replicated, replica.ds_pipe_replicated = False, True
    pipeline.clip_on_the_whole_model(torch.nn.ParameterList([owned, replica]))
    assert owned.model_parallel and not hasattr(replica, "model_parallel")


# ---- the loop's per-step path -------------------------------------------------------------------

class FakePipelineEngine:
    def __init__(self, micro_batches: int):
        self.micro_batches, self.calls = micro_batches, 0

    def train_batch(self, data_iter):
        self.calls += 1
        pulled = [next(data_iter) for _ in range(self.micro_batches)]
        return torch.tensor(float(sum(x for x, _ in pulled)))


def test_pipeline_steps_are_one_train_batch_with_one_synchronize():
    engine, calls, times = FakePipelineEngine(3), {"sync": 0, "barrier": 0}, LoopTimes()
    batches = ((i, i) for i in range(10**6))
    run_loop(engine, None, batches, steps=5, warmup=2, grad_accum=3, float_dtype=torch.float32,
             sync=lambda: calls.__setitem__("sync", calls["sync"] + 1),
             barrier=lambda: calls.__setitem__("barrier", calls["barrier"] + 1), times=times, pipeline=True)
    assert engine.calls == 5 and calls == {"sync": 5 + 1, "barrier": 2}
    assert len(times.step_s) == 3 and list(times.phase_s) == ["train_batch"] and len(times.phase_s["train_batch"]) == 3
    assert times.compute_s == [] and times.losses() == [3.0, 12.0, 21.0, 30.0, 39.0]
    assert timing(False, 3, pipeline=True) == {"timing_mode": "pipeline_step", "syncs_per_step": 1}


# ---- real runs: P=2 gives P=1's loss curve ------------------------------------------------------

def pipeline_run(tmp_path_factory, name: str, ranks: int, port: int, *flags: str) -> dict:
    """The run's record (checked against the schema), with what it printed under ``stdout``."""
    results = tmp_path_factory.mktemp(name) / "r.jsonl"
    proc = run_cmd(["torchrun", "--nproc_per_node", str(ranks), "--master_port", str(port), "-m", "ds_bench", "run",
                    "--workload", "gpt2", *SHAPE, "--micro-batch", "2", "--set", "bf16.enabled=false",
                    "--set", "gradient_accumulation_steps=4", "--steps", "8", "--warmup", "2",
                    "--results", str(results), *flags], **OFFLINE, **ONE_THREAD)
    assert proc.returncode == 0, explain(proc)
    (record,) = records(results)
    return {**record, "stdout": proc.stdout}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    zero0 = ("--ds-config", "ds_configs/zero0.json")
    return {"p1": pipeline_run(tmp_path_factory, "p1", 1, 29871 + 40, *zero0, "--pipeline-stages", "1"),
            "p2": pipeline_run(tmp_path_factory, "p2", 2, 29871 + 41, *zero0, "--pipeline-stages", "2"),
            "p2_z1_ckpt": pipeline_run(tmp_path_factory, "p2z1", 2, 29871 + 42, "--ds-config", "ds_configs/zero1.json",
                                       "--pipeline-stages", "2", "--partition", "type:GPT2Block",
                                       "--activation-checkpointing")}


def assert_same_curve(curve: list[float], reference: list[float], rel: float) -> None:
    assert len(curve) == len(reference) == 8 and curve[-1] < curve[0]
    for mine, theirs in zip(curve, reference):
        assert abs(mine - theirs) <= rel * abs(theirs), (curve, reference)


CURVE_REL = 1e-4
"""The issue's bound. Measured: P=2 gives P=1's curve to 1e-6 (10.834986 .. 10.421997). Before
``pipeline.clip_on_the_whole_model`` the ZeRO-0 P=2 run was 1.4e-4 apart from step 3 on, in any shell:
DeepSpeed's fp32 clipping took the norm over the first stage's gradients only, so P=2 did not clip where
P=1 did (unclipped, both agreed; ZeRO-1's own clipping counts every stage)."""


@pytest.mark.dist
@pytest.mark.parametrize("name", ["p2", "p2_z1_ckpt"])
def test_two_stages_give_the_loss_curve_of_one(runs, name):
    """p2: ZeRO-0 fp32, 4 micro-batches; p2_z1_ckpt: ZeRO-1, blocks recomputed, split by type."""
    assert_same_curve(runs[name]["metrics"]["loss_curve"], runs["p1"]["metrics"]["loss_curve"], CURVE_REL)


@pytest.mark.dist
def test_pipeline_records_say_the_layout(runs):
    params = 4 * (12 * 64 * 64 + 13 * 64) + (50257 + 1024) * 64 + 2 * 64  # gpt2_param_count(4, 64)
    p1, p2 = runs["p1"], runs["p2"]
    assert (size_of(p1, "pipeline_stages"), p1["data_parallel_size"], degree(p1, "pipeline_stages")["settings"]["micro_batches"]) == (1, 1, 4)
    assert (size_of(p2, "pipeline_stages"), p2["data_parallel_size"], degree(p2, "pipeline_stages")["settings"]["micro_batches"],
            p2["world_size"]) == (2, 1, 4, 2)
    assert p1["params"] == p2["params"] == params and p2["train_batch_size"] == 2 * 4 * 1
    assert degree(p2, "pipeline_stages")["settings"]["schedule_bubble"] == pytest.approx(1 / 5) and p2["metrics"]["timing_mode"] == "pipeline_step"
    stages = p2["pipeline_layout"]
    assert [s["stage"] for s in stages] == [0, 1] and sum(s["n_blocks"] for s in stages) == 4
    assert sum(s["unique_params"] for s in stages) == params
    assert stages[1]["params"] - stages[1]["unique_params"] == 50257 * 64  # the tied head's copy of wte
    assert stages[0]["blocks"][0] == 0 and stages[1]["blocks"][1] == 3
    uniform_by_type = runs["p2_z1_ckpt"]["pipeline_layout"]
    assert [s["n_blocks"] for s in uniform_by_type] == [2, 2]  # type:GPT2Block balances the blocks
    assert runs["p2_z1_ckpt"]["metrics"]["hardware_tflops_per_device"] > runs["p2_z1_ckpt"]["metrics"]["tflops_per_device"]


@pytest.mark.dist
@pytest.mark.full
def test_two_stages_times_two_replicas_on_four_oversubscribed_ranks(tmp_path_factory):
    """P=2 x DP=2 (4 torchrun ranks on this machine's 2 cores) trains like P=1 x DP=2: each replica reads
    its own shard whatever the stages, and the replicas' gradients are averaged once per step."""
    zero0 = ("--ds-config", "ds_configs/zero0.json")
    p2dp2 = pipeline_run(tmp_path_factory, "p2dp2", 4, 29871 + 43, *zero0, "--pipeline-stages", "2")
    p1dp2 = pipeline_run(tmp_path_factory, "p1dp2", 2, 29871 + 44, *zero0, "--pipeline-stages", "1")
    assert (p2dp2["world_size"], size_of(p2dp2, "pipeline_stages"), p2dp2["data_parallel_size"]) == (4, 2, 2)
    assert (p1dp2["world_size"], p1dp2["data_parallel_size"]) == (2, 2)
    assert p2dp2["train_batch_size"] == p1dp2["train_batch_size"] == 2 * 4 * 2
    assert_same_curve(p2dp2["metrics"]["loss_curve"], p1dp2["metrics"]["loss_curve"], CURVE_REL)


@pytest.mark.dist
@pytest.mark.parametrize("name", ["p2", "p2_z1_ckpt"])
def test_each_stage_has_its_timers_and_bubble(runs, name):
    """Both stages' instruction timers (``ds_bench.measure.stage_timers``) from the same real runs: what each stage
    must have done is positive, compute fits in the step, the bubble is a share, and the summary prints them."""
    record = runs[name]
    stages = record["pipeline_layout"]
    for stage in stages:
        times = stage["times_ms"]
        assert stage["rank"] == stage["stage"] and stage["peak_mem_bytes"] > 0
        for key in ("forward_compute", "backward_compute", "batch_load", "tied_grads_all_reduce", "optimizer", "step"):
            assert times[key] > 0, (stage["stage"], key, times)
        assert times["forward_compute"] + times["backward_compute"] <= times["step"], times
        assert 0 <= stage["bubble"] < 1
        line = next(line for line in record["stdout"].splitlines() if line.startswith(f"    stage {stage['stage']} ("))
        assert f"forward-compute {times['forward_compute']:.1f} |" in line
        assert f"; bubble {stage['bubble']:.0%} (schedule 20%); peak" in line
    first, last = (stage["times_ms"] for stage in stages)
    assert first["forward_send"] > 0 and first["backward_recv"] > 0 and first["forward_recv"] == 0
    assert last["forward_recv"] > 0 and last["backward_send"] > 0 and last["backward_recv"] == 0
    if name == "p2_z1_ckpt":  # two blocks per stage: the last stage's forward also holds the LM head and the loss
        assert last["forward_compute"] > 2 * first["forward_compute"], (first, last)
