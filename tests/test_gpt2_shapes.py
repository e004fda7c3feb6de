"""GPT-2-architecture shapes: the GPT-3 paper's sizes, custom ``--layers/--hidden/--heads``, and the
parameter formula checked against HF ``GPT2LMHeadModel`` built on the meta device (13B is instant)."""

import pytest
import torch

from ds_bench.config.run_config import RunConfig
from ds_bench.errors import UserError
from ds_bench.workloads import build_workload
from ds_bench.workloads.gpt2_shapes import GPT3_SHAPES, SHAPES, gpt2_param_count
from tests.conftest import REPO

CONFIG = str(REPO / "ds_configs" / "zero0.json")


def workload(**kw):
    return build_workload(RunConfig(workload="gpt2", ds_config=CONFIG, **kw))


def hf_param_count(config) -> int:
    from transformers import GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("size", list(SHAPES))
def test_formula_is_the_hf_count_at_every_named_size(size):
    config = workload(size=size, seq_len=128).config
    assert hf_param_count(config) == gpt2_param_count(config.n_layer, config.n_embd, config.vocab_size,
                                                      config.n_positions)


@pytest.mark.parametrize("shape", [(1, 8, 1), (3, 48, 6), (4, 64, 4), (5, 96, 3)])
def test_formula_is_the_hf_count_at_custom_shapes(shape):
    layers, hidden, heads = shape
    w = workload(layers=layers, hidden=hidden, heads=heads, seq_len=2048)
    assert (w.config.n_layer, w.config.n_embd, w.config.n_head, w.config.n_positions) == (layers, hidden, heads, 2048)
    assert w.size == f"L{layers}-H{hidden}-A{heads}" and w.hidden_size == hidden
    assert hf_param_count(w.config) == gpt2_param_count(layers, hidden, 50257, 2048)


def test_gpt3_shapes_are_the_papers():
    """Brown et al. 2020, table 2.1 (the two inconsistent rows resolved as gpt2_shapes says)."""
    assert GPT3_SHAPES == {"gpt3-125m": (12, 768, 12), "gpt3-350m": (24, 1024, 16), "gpt3-760m": (24, 1536, 16),
                           "gpt3-1.3b": (24, 2048, 16), "gpt3-2.7b": (32, 2560, 32), "gpt3-6.7b": (32, 4096, 32),
                           "gpt3-13b": (40, 5120, 40)}
    params = {name: gpt2_param_count(n, d, 50257, 2048) for name, (n, d, _) in GPT3_SHAPES.items()}
    nominal = {"gpt3-125m": 125e6, "gpt3-350m": 350e6, "gpt3-760m": 760e6, "gpt3-1.3b": 1.3e9,
               "gpt3-2.7b": 2.7e9, "gpt3-6.7b": 6.7e9, "gpt3-13b": 13e9}
    for name, n in params.items():
        assert abs(n / nominal[name] - 1) < 0.06, (name, n)  # the paper's names are rounded
    assert workload(size="gpt3-13b", seq_len=1024).config.n_positions == 2048  # the paper's n_ctx


@pytest.mark.parametrize("kw, pattern", [
    ({"layers": 4}, r"needs --layers, --hidden and --heads together; missing --hidden, --heads"),
    ({"layers": 4, "hidden": 64}, r"missing --heads"),
    ({"hidden": 64, "heads": 4}, r"missing --layers"),
    ({"layers": 4, "hidden": 65, "heads": 4}, r"--hidden 65 is not divisible by --heads 4.*e\.g\. --heads 5"),
    ({"layers": 0, "hidden": 64, "heads": 4}, r"--layers must be a positive integer, got 0"),
    ({"layers": 2, "hidden": -64, "heads": 4}, r"--hidden must be a positive integer, got -64"),
    ({"layers": 2, "hidden": 64, "heads": 4, "size": "tiny"}, r"--layers/--hidden/--heads give the shape: not with --size"),
])
def test_custom_shape_errors(kw, pattern):
    with pytest.raises(UserError, match=pattern):
        workload(**kw)


def test_custom_shape_flags_are_refused_by_other_workloads():
    with pytest.raises(UserError, match=r"--layers: workload mnist has no custom shapes"):
        build_workload(RunConfig(workload="mnist", ds_config=CONFIG, layers=2))
