"""Same seed, same model, in every layout (``ds_bench.workloads.hf_init``): each parameter is drawn from a
generator seeded by (``--seed``, its name in the HF model), so the plain model, a pipeline's stages, a
ZeRO-3 partitioned build (``zero.Init``) and AutoTP's shards start from the same weights.

In-process: the pipeline's layers get the HF model's weights bitwise, whatever the global RNG did before.
Real runs (fp32, one step, no warm-up): the first step's loss, before any update, is the initial model's;
equal to 1e-6 relative across layouts. The runs read one small text file, so that layouts of different
data-parallel sizes see the same sequences: its sequences are shuffled by the seed and dealt to the ranks
in turn (``workloads.base.shard_epochs``), and the record's loss is the mean over ranks, so 2 ranks x
micro-batch 1 read, and average over, the sequences 1 rank x micro-batch 2 reads.
Measured (this CPU): all 10.824523 (ZeRO-3, P=2: 10.824524); before this init (layers seeded by pipeline
index, HF's init in draw order) P=2 started at 10.797367, the plain model and ZeRO-3 at 10.821039.
"""

import random
import sys
from pathlib import Path

import pytest
import torch

from ds_bench.workloads import gpt2_pipe, hf_init
from tests.conftest import OFFLINE, explain, records, run_cmd, size_of

SHAPE = ("--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "32")
RUN = (*SHAPE, "--set", "bf16.enabled=false", "--set", "gradient_accumulation_steps=2", "--steps", "1",
       "--warmup", "0", "--seed", "3", "--ds-config")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
REL = 1e-6
WORDS = ("the a of to and in that it is was for on with as his he be at by had not but from this which you "
         "were her she all they an one said there we been would what when so if no my more out up into").split()


# ---- in-process: the pipeline's layers are the HF model's ------------------------------------------

def small_gpt2_config(n_layer: int = 3):
    from transformers import GPT2Config

    return GPT2Config(vocab_size=97, n_positions=16, n_layer=n_layer, n_embd=32, n_head=4, resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)


def seeded_hf_gpt2(config, seed: int):
    from transformers import GPT2LMHeadModel

    with hf_init.hf_init_skipped():
        model = GPT2LMHeadModel(config)
    hf_init.initialize(model, seed, hf_init.gpt2_std(config.n_layer))
    return model


def pipeline_layers(config, seed: int) -> torch.nn.Module:
    """Every layer of the pipeline in one module, named as a ``PipelineModule`` names them, initialised."""
    specs = gpt2_pipe.layer_specs(config)
    stage = torch.nn.Module()
    stage.tied_modules = torch.nn.ModuleDict({gpt2_pipe.TIED_KEY: specs[0].build()})
    for index in range(1, len(specs) - 1):
        stage.add_module(str(index), specs[index].build())
    hf_init.initialize(stage, seed, hf_init.gpt2_std(config.n_layer),
                       lambda name: gpt2_pipe.hf_name(name, config.n_layer))
    return stage


def test_pipeline_layers_start_from_the_hf_models_weights():
    config = small_gpt2_config()
    torch.manual_seed(0)
    hf = dict(seeded_hf_gpt2(config, 5).named_parameters())
    torch.manual_seed(1)  # the global RNG plays no part
    stage = pipeline_layers(config, 5)
    assert len(list(stage.parameters())) == len(hf)
    for name, param in stage.named_parameters():
        module, _, leaf = name.rpartition(".")
        assert torch.equal(param, hf[f"{gpt2_pipe.hf_name(module, config.n_layer)}.{leaf}"]), name
    other = dict(seeded_hf_gpt2(config, 6).named_parameters())
    assert not torch.equal(other["transformer.h.0.attn.c_attn.weight"], hf["transformer.h.0.attn.c_attn.weight"])


def test_a_layers_weights_do_not_depend_on_the_depth_around_it():
    """Block 0 of a 3-block model is block 0 of a 5-block one, but for the depth-scaled residual projections."""
    three, five = (dict(seeded_hf_gpt2(small_gpt2_config(n), 5).named_parameters()) for n in (3, 5))
    assert torch.equal(three["transformer.h.0.attn.c_attn.weight"], five["transformer.h.0.attn.c_attn.weight"])
    ratio = five["transformer.h.0.mlp.c_proj.weight"] / three["transformer.h.0.mlp.c_proj.weight"]
    torch.testing.assert_close(ratio, torch.full_like(ratio, (6 / 10) ** 0.5))


def test_llama_gets_hfs_distributions_and_a_tied_head_is_drawn_once():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=97, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    with hf_init.hf_init_skipped():
        model = LlamaForCausalLM(config)
    hf_init.initialize(model, 0, hf_init.constant_std())
    layer = model.model.layers[0]
    assert layer.mlp.down_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.model.embed_tokens.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.equal(layer.input_layernorm.weight, torch.ones(256)) and torch.equal(model.model.norm.weight,
                                                                                     torch.ones(256))
    assert model.lm_head.weight is model.model.embed_tokens.weight


# ---- real runs: the first step's loss of every layout ----------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """A text file of ~1,500 GPT-2 tokens (46 sequences of 32), and a token cache of its own."""
    folder = tmp_path_factory.mktemp("same_init")
    rng = random.Random(0)
    (folder / "words.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(1500)) + "\n")
    return {"path": str(folder / "words.txt"), "cache": str(folder / "cache")}


def first_loss(data: dict, name: str, ranks: int, port: int, *flags: str) -> tuple[float, dict]:
    """The first step's loss of a run on ``ranks`` ranks (torchrun for 2), and its record."""
    results = data["path"] + f".{name}.jsonl"
    start = [sys.executable] if ranks == 1 else ["torchrun", "--nproc_per_node", str(ranks), "--master_port", str(port)]
    proc = run_cmd([*start, "-m", "ds_bench", "run", "--data", data["path"], *flags, "--results", results],
                   DS_BENCH_CACHE=data["cache"], **OFFLINE, **ONE_THREAD)
    assert proc.returncode == 0, explain(proc)
    (record,) = records(Path(results))
    return record["metrics"]["loss_curve"][0], record


@pytest.fixture(scope="module")
def gpt2(data) -> dict:
    """GPT-2 plain (1 rank, micro-batch 2), 2 pipeline stages (2 ranks, micro-batch 2) and ZeRO-3 partitioned
    (2 ranks, micro-batch 1: the same 2 sequences per micro-step)."""
    run = ("--workload", "gpt2", *RUN)
    return {"plain": first_loss(data, "gpt2", 1, 0, *run, "ds_configs/zero1.json", "--micro-batch", "2"),
            "pipeline": first_loss(data, "gpt2_p2", 2, 29971, *run, "ds_configs/zero1.json", "--micro-batch", "2",
                                   "--pipeline-stages", "2"),
            "zero3": first_loss(data, "gpt2_z3", 2, 29972, *run, "ds_configs/zero3.json", "--micro-batch", "1")}


@pytest.mark.dist
@pytest.mark.full  # make test's 15 minutes; CI runs it in the full tier
def test_two_pipeline_stages_start_from_the_plain_model(gpt2):
    (plain, _), (pipeline, record) = gpt2["plain"], gpt2["pipeline"]
    print(f"first-step loss: plain {plain}, 2 pipeline stages {pipeline}")
    assert (size_of(record, "pipeline_stages"), record["world_size"]) == (2, 2)
    assert pipeline == pytest.approx(plain, rel=REL)


@pytest.mark.dist
@pytest.mark.full  # make test's 15 minutes; CI runs it in the full tier
def test_a_zero3_partitioned_build_starts_from_the_plain_model(gpt2):
    (plain, _), (zero3, record) = gpt2["plain"], gpt2["zero3"]
    print(f"first-step loss: plain {plain}, ZeRO-3 partitioned {zero3}")
    assert (record["zero_stage"], record["build"]["partitioned"], record["world_size"]) == (3, True, 2)
    assert zero3 == pytest.approx(plain, rel=REL)


@pytest.mark.dist
@pytest.mark.full
def test_tensor_parallel_llama_starts_from_the_plain_model(data):
    """AutoTP shards the model after the build (GPT-2 it cannot shard): plain Llama against TP=2."""
    run = ("--workload", "llama", *RUN, "ds_configs/zero1.json", "--micro-batch", "2")
    plain, _ = first_loss(data, "llama", 1, 0, *run)
    sharded, record = first_loss(data, "llama_tp2", 2, 29973, *run, "--tensor-parallel", "2")
    print(f"first-step loss: plain {plain}, tensor parallel 2 {sharded}")
    assert (size_of(record, "tensor_parallel"), record["world_size"]) == (2, 2)
    assert sharded == pytest.approx(plain, rel=REL)
