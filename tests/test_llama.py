"""The Llama workload (published shapes, parameters, FLOPs against torch's counter) and DeepSpeed AutoTP
tensor parallelism (the layout's checks, and a real 2-rank run against a 1-rank one)."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ds_bench.config.run_config import RunConfig
from ds_bench.engines.degrees import tensor_parallel
from ds_bench.engines.degrees.mesh import Mesh
from ds_bench.errors import UserError
from ds_bench.workloads import build_workload, llama_shapes
from tests.conftest import REPO, degree, explain, records, run_cmd, size_of

CONFIG = str(REPO / "ds_configs" / "zero1.json")

MODEL_CARD_PARAMS = {"llama3.2-1b": 1_235_814_400, "llama3.2-3b": 3_212_749_824, "llama3.1-8b": 8_030_261_248,
                     "llama3.1-70b": 70_553_706_496}
"""Parameter counts of Meta's published models (the model cards say 1.24B, 3.21B, 8.03B and 70.6B)."""


def workload(**kw):
    return build_workload(RunConfig(workload="llama", ds_config=CONFIG, **kw))


def test_the_formula_counts_the_published_models():
    for size, count in MODEL_CARD_PARAMS.items():
        assert llama_shapes.param_count(llama_shapes.SHAPES[size]) == count, size


@pytest.mark.parametrize("size", ["tiny", *MODEL_CARD_PARAMS])
def test_hf_builds_exactly_the_counted_parameters(size):
    """The HF model of each shape, built on the meta device (no memory), holds what the formula says."""
    from transformers import LlamaForCausalLM

    from ds_bench.workloads.llama import llama_config

    shape = llama_shapes.SHAPES[size]
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(shape, 1024))
    assert sum(p.numel() for p in model.parameters()) == llama_shapes.param_count(shape)
    assert model.config.num_key_value_heads == shape.kv_heads and model.config.hidden_act == "silu"


def test_grouped_query_attention_shrinks_the_projections_not_the_attention_products():
    """Llama 3.1 8B at 4,096 tokens: N = 6.98B of matmul weights (less the 0.53B embedding, plus the
    0.53B head), 32 x 32 heads x 128 x 4096 for the attention products; with 8 KV heads instead of 32
    the k and v projections are a quarter, and 12 L H Q T is unchanged."""
    s = llama_shapes.SHAPES["llama3.1-8b"]
    n = llama_shapes.matmul_params(s)
    assert n == llama_shapes.param_count(s) - s.vocab * s.hidden - (2 * s.hidden * s.n_layer + s.hidden)
    per_token = llama_shapes.flops_per_token(s, 4096)
    assert per_token == 6 * n + 12 * 32 * 32 * 128 * 4096
    mha = llama_shapes.LlamaShape(**{**s.__dict__, "kv_heads": s.heads})
    assert llama_shapes.matmul_params(mha) - n == s.n_layer * 2 * s.hidden * (32 - 8) * 128
    assert llama_shapes.flops_per_token(mha, 4096) - per_token == 6 * (llama_shapes.matmul_params(mha) - n)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_flops_formula_matches_torch_flop_counter(checkpointing):
    """Tiny Llama, eager attention (torch's CPU SDPA kernel has no formula in the counter), one forward +
    backward of 2 x 64 tokens: the counter within 5% of the formula (model FLOPs; with activation
    checkpointing the hardware FLOPs, one more forward of the blocks)."""
    w = workload(size="tiny", seq_len=64, attn="eager", activation_checkpointing=checkpointing)
    torch.manual_seed(0)
    model = w.build_model()
    batch = next(iter(w.batches(0, 1, 2)))
    with FlopCounterMode(display=False) as counter:
        w.loss(model, batch).backward()
    expected = 2 * (w.hardware_flops_per_sample(model) if checkpointing else w.model_flops_per_sample(model))
    print(f"tiny llama, checkpointing {checkpointing}: counted {counter.get_total_flops():.4g}, formula {expected:.4g}")
    assert counter.get_total_flops() == pytest.approx(expected, rel=0.05)


def test_a_custom_shape_is_multi_head_with_llamas_mlp_width_and_counted_exactly():
    """``--layers 3 --hidden 96 --heads 6``: KV heads = heads, MLP 2/3 x 4 x 96 = 256 rounded up to 256's
    multiple, GPT-2's vocabulary; HF's model of it (meta device) holds what the formula says."""
    from transformers import LlamaForCausalLM

    from ds_bench.workloads.llama import llama_config

    w = workload(layers=3, hidden=96, heads=6, seq_len=32)
    assert w.shape == llama_shapes.LlamaShape(3, 96, 6, 6, 16, 256, 50257, True) and w.size == "L3-H96-A6"
    assert llama_shapes.swiglu_width(4096) == 11008  # LLaMA-7B's MLP width by the same rule
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(w.shape, 32))
    assert sum(p.numel() for p in model.parameters()) == llama_shapes.param_count(w.shape)
    with pytest.raises(UserError, match="not with --size"):
        workload(layers=3, hidden=96, heads=6, size="tiny")


def test_the_workload_says_what_it_runs():
    w = workload(size="tiny", seq_len=32)
    model = w.build_model()
    assert w.model_settings(model) == {"attn_implementation": "sdpa", "activation_function": "silu", "tokenizer": None}
    assert w.tokens_per_sample == 32 and w.hidden_size == 64 and w.sample_unit == "sequences"
    assert w.tensor_parallel_divisors == {"attention heads": 4, "KV heads": 2, "hidden size": 64, "MLP width": 128}


def test_local_pretrained_weights_and_their_tokenizer_are_what_the_run_reads(tmp_path, shakespeare):
    """``--model PATH``: a ``save_pretrained`` folder (a tiny Llama, with GPT-2's tokenizer saved beside it
    as its own) is loaded whole: the same weights, its tokenizer on ``--data``, the fine-tuning rate."""
    from transformers import LlamaForCausalLM

    from ds_bench.data.tokenizer import load_gpt2_tokenizer
    from ds_bench.workloads.llama import llama_config

    torch.manual_seed(5)
    saved = LlamaForCausalLM(llama_config(llama_shapes.SHAPES["tiny"], 64))
    saved.save_pretrained(tmp_path / "m")
    load_gpt2_tokenizer().save_pretrained(tmp_path / "m")
    w = workload(model_path=str(tmp_path / "m"), seq_len=32, data=str(shakespeare))
    assert (w.size, w.default_lr, w.partitioned_build) == (None, 5e-5, False)
    assert w.shape == llama_shapes.SHAPES["tiny"]
    w.load_data(1, 2)
    model = w.build_model()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), saved.state_dict().values()))
    assert w.model_settings(model)["tokenizer"] == str(tmp_path / "m")
    assert torch.isfinite(w.loss(model, next(iter(w.batches(0, 1, 2)))))
    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(UserError, match="model_type 'gpt2', this workload needs 'llama'"):
        workload(model_path=str(other))


# --- tensor parallelism: the layout (pure) ---

DIVISORS = {"attention heads": 32, "KV heads": 8, "hidden size": 4096, "MLP width": 14336}


def test_a_tensor_parallel_layout_splits_the_world_into_replicas():
    tp = tensor_parallel.resolve(2, 8, DIVISORS)
    assert (tp.size, tp.data_parallel_size) == (2, 4)
    mesh = Mesh(8, (tp,))
    assert [mesh.data_parallel.replica(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]  # a TP group: consecutive ranks
    assert (mesh.data_parallel_size, mesh.record_blocks()) == (4, {"tensor_parallel": {"size": 2, "settings": None}})
    assert tensor_parallel.resolve(None, 8, DIVISORS) is None


@pytest.mark.parametrize("size, world, divisors, message", [
    (16, 16, DIVISORS, "does not divide the model's 8 KV heads"),
    (4, 4, {**DIVISORS, "MLP width": 30}, "does not divide the model's 30 MLP width"),
])
def test_a_layout_autotp_cannot_shard_is_refused_by_name(size, world, divisors, message):
    with pytest.raises(UserError, match=message):
        tensor_parallel.resolve(size, world, divisors)


def test_only_a_workload_autotp_can_shard_takes_tensor_parallelism():
    from ds_bench.workloads import REGISTRY

    REGISTRY["llama"].check_tensor_parallel_flag()
    for name in ("gpt2", "mnist", "resnet"):
        with pytest.raises(UserError, match=f"AutoTP cannot shard workload {name}"):
            REGISTRY[name].check_tensor_parallel_flag()


def test_a_tensor_parallel_group_across_nodes_is_warned_against():
    assert tensor_parallel.across_nodes_warning(tensor_parallel.TensorParallelPlan(4, 2), 8) is None
    assert tensor_parallel.across_nodes_warning(tensor_parallel.TensorParallelPlan(2, 1), None) is None
    text = tensor_parallel.across_nodes_warning(tensor_parallel.TensorParallelPlan(4, 2), 2)
    assert text.startswith("--tensor-parallel 4 with 2 rank(s) per node: tensor-parallel groups span nodes")


def test_deepspeed_gets_autotp_and_the_batch_it_checks():
    """ds_bench's global batch counts data-parallel replicas; this DeepSpeed counts every rank."""
    ds_cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, "train_batch_size": 6}
    tp = tensor_parallel.TensorParallelPlan(2, 1)
    out = tensor_parallel.deepspeed_config(tp, ds_cfg)
    assert out["tensor_parallel"] == {"autotp_size": 2} and out["train_batch_size"] == 12
    assert ds_cfg["train_batch_size"] == 6  # the record's figure is untouched
    assert tensor_parallel.deepspeed_config(None, ds_cfg) is ds_cfg


def test_a_tensor_parallel_degree_is_a_positive_integer():
    """What a TP layout may not combine with is the legality table's (tests/test_legality.py)."""
    with pytest.raises(UserError, match="--tensor-parallel must be a positive integer"):
        RunConfig(workload="llama", ds_config=CONFIG, tensor_parallel=0)


# --- real runs ---

RUN = ["-m", "ds_bench", "run", "--workload", "llama", "--size", "tiny", "--seq-len", "32", "--micro-batch", "4",
       "--set", "bf16.enabled=false", "--steps", "8", "--warmup", "1", "--lr", "3e-3", "--seed", "3"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="module", params=[("zero1", 29901), pytest.param(("zero3", 29902), marks=pytest.mark.full)],
                ids=["zero1", "zero3"])
def tp_runs(request, tmp_path_factory, shakespeare):
    """The same tiny Llama, seed and Shakespeare batches (one data-parallel replica), fp32, ZeRO-1 (ZeRO-3,
    partitioned build, in the full tier): on one rank, and sharded over two with AutoTP under torchrun."""
    import sys

    config, port = request.param
    folder = tmp_path_factory.mktemp(f"llama_tp_{config}")
    cache = {"DS_BENCH_CACHE": str(tmp_path_factory.mktemp("llama_cache")), **OFFLINE}
    run = [*RUN, "--ds-config", f"ds_configs/{config}.json", "--data", str(shakespeare)]
    one = run_cmd([sys.executable, *run, "--results", str(folder / "one.jsonl")], timeout=300, **cache)
    assert one.returncode == 0, explain(one)
    two = run_cmd(["torchrun", "--nproc_per_node", "2", "--master_port", str(port), *run, "--tensor-parallel", "2",
                   "--results", str(folder / "two.jsonl")], timeout=300, **cache)
    assert two.returncode == 0, explain(two)
    return records(folder / "one.jsonl")[0], records(folder / "two.jsonl")[0], two.stdout


@pytest.mark.dist
def test_two_tensor_parallel_ranks_reproduce_one_rank(tp_runs):
    one, two, summary = tp_runs
    assert (one["status"], two["status"]) == ("ok", "ok")
    assert (size_of(two, "tensor_parallel"), two["data_parallel_size"], two["world_size"]) == (2, 1, 2)
    assert two["train_batch_size"] == one["train_batch_size"] == 4  # one replica: micro-batch 4 x 1 accum x 1
    curve_one, curve_two = one["metrics"]["loss_curve"], two["metrics"]["loss_curve"]
    print(f"loss 1 rank {curve_one}\nloss 2 TP ranks {curve_two}")
    assert len(curve_one) == len(curve_two) == 8 and all(math.isfinite(x) for x in curve_one)
    for a, b in zip(curve_one, curve_two):
        assert b == pytest.approx(a, rel=1e-4)
    assert curve_one[-1] < 0.97 * curve_one[0]  # it trains: real text, from ln(50257) = 10.8 down
    assert "1 data-parallel (tp2)" in summary
    # one replica: no data-parallel collective; AutoTP's 7 all-reduces x 2 blocks + 2 (embedding, LM head),
    # each of 4 x 32 x 64 fp32 elements
    assert two["comm_bound"]["bus_bytes_per_step"] == {"tp_all_reduce": 2 * (2 - 1) / 2 * (7 * 2 + 2) * 4 * 32 * 64 * 4}


@pytest.mark.dist
def test_the_tensor_parallel_all_reduces_are_timed_and_counted_as_modelled(tp_runs):
    """Every all-reduce AutoTP makes is timed (``ds_bench.measure.layout_comm``): as many per step as the comm
    verdict's model counts (``Workload.tensor_parallel_all_reduces``), and a real share of the step."""
    one, two, summary = tp_runs
    comm = degree(two, "tensor_parallel")["comm"]
    print(comm)
    assert degree(one, "tensor_parallel").get("comm") is None and comm["collective"] == "all_reduce"
    assert comm["calls_per_step"] == 7 * 2 + 2
    assert 0 < comm["ms_per_step"] < two["metrics"]["step_ms_max"] and 0 < comm["share_of_step"] < 1
    assert f"{comm['calls_per_step']} all-reduces per step" in summary


@pytest.mark.dist
@pytest.mark.parametrize("selective", [False, True], ids=["full", "selective"])
def test_a_checkpointed_block_repeats_one_tensor_parallel_all_reduce(selective, tmp_path, shakespeare):
    """torch's non-reentrant checkpoint, full or selective, stops recomputing once the tensors backward needs are
    back: it repeats the attention output's all-reduce, not the MLP's (``perf.step.TP_RECOMPUTED``): 8 per block
    where a plain run makes 7, as the run's verdict and plan's step model count."""
    from ds_bench.perf import step

    results = tmp_path / "r.jsonl"
    options = ["--activation-checkpointing", *(["--selective-checkpointing"] if selective else [])]
    proc = run_cmd(["torchrun", "--nproc_per_node", "2", "--master_port", str(29903 + selective), *RUN,
                    "--ds-config", "ds_configs/zero1.json", "--data", str(shakespeare), "--tensor-parallel", "2",
                    "--steps", "3", *options, "--results", str(results)], timeout=300,
                   DS_BENCH_CACHE=str(tmp_path / "cache"), **OFFLINE)
    assert proc.returncode == 0, explain(proc)
    [record] = [r for r in records(results) if r.get("rank", 0) == 0]
    blocks = llama_shapes.SHAPES["tiny"].n_layer
    expected = (step.TP_ALL_REDUCES["autotp"] + step.TP_RECOMPUTED["autotp"]) * blocks + 2
    assert degree(record, "tensor_parallel")["comm"]["calls_per_step"] == expected


@pytest.mark.dist
def test_each_tensor_parallel_rank_holds_a_share_of_the_model(tp_runs):
    """Both runs count the whole model; rank 0 of the TP run holds its shards of every block's projections
    and the layers AutoTP replicates (norms; the embedding), so less than the whole, more than half."""
    one, two, _ = tp_runs
    whole = llama_shapes.param_count(llama_shapes.SHAPES["tiny"])
    assert one["params"] == two["params"] == whole
    held = two["build"]["rank_params"]
    print(f"tiny llama: {whole:,} parameters, rank 0 of 2 AutoTP ranks holds {held:,}")
    assert whole / 2 < held < whole
    assert one["build"]["rank_params"] is None


@pytest.mark.dist
@pytest.mark.full  # the layouts run for real above; this is the sweep's axis around them
def test_a_sweep_with_a_tensor_parallel_axis_ranks_tp2_beside_data_parallelism(tmp_path):
    from tests.conftest import ds_bench

    results = tmp_path / "s.jsonl"
    proc = ds_bench("sweep", "--workload", "llama", "--size", "tiny", "--seq-len", "32", "--ds-config", "zero1.json",
                    "--precision", "fp32", "--stages", "1", "--tensor-parallel", "1,2", "--micro-batch", "2",
                    "--nproc", "2", "--launcher", "torchrun", "--steps", "4", "--warmup", "1", "--results", str(results),
                    "--master-port", "29903", timeout=600, **OFFLINE)
    assert proc.returncode == 0, explain(proc)
    points = {r["key"]: r for r in records(results) if r.get("kind") == "sweep_point"}
    assert {k: r["status"] for k, r in points.items()} == {"z1 off=none fp32 mbs=2": "ok", "tp2 z1 off=none fp32 mbs=2": "ok"}
    (tp2,) = [r for r in records(results.with_suffix(".runs.jsonl")) if size_of(r, "tensor_parallel") == 2]
    assert (tp2["data_parallel_size"], tp2["train_batch_size"]) == (1, 2)
    assert any(line.split()[1:3] == ["tp2", "z1"] for line in proc.stdout.splitlines()), proc.stdout
