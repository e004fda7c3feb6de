"""The model family ``ds-bench capacity`` searches along, smallest first (pure).

- ``gpt3``: the GPT-3 paper's shapes (``ds_bench.workloads.gpt2_shapes``' ``gpt3-*`` sizes), in order
  (workload gpt2); ``llama3``: Meta's published Llama 3 sizes (``ds_bench.workloads.llama_shapes``: 3.2-1B,
  3.2-3B, 3.1-8B, 3.1-70B; workload llama);
- ``--scale layers``: the base shape (``--layers L --hidden H --heads A``) with k x L layers,
  k = 1 .. ``--max-scale``;
- ``--scale hidden``: k x H wide with k x A heads (the head width stays H / A), k = 1 .. ``--max-scale``;
- ``--scale seq``: one model (``--size`` or the base shape) at sequence lengths the search chooses
  (``capacity.seq_search``), a member per length (``seq_member``: ``seq 8192``), made as the search asks.

The shapes are the workload's (``--workload gpt2``; ``llama``: ``llama_shapes.custom_shape``; ``moe``:
``moe_shapes.run_shape``, every member with the router of the run's ``--experts`` / ``--top-k``). Each member
carries the ``ds-bench run`` arguments that build it and its parameter count (``gpt2_shapes.gpt2_param_count``,
``llama_shapes.param_count``, ``moe_shapes.param_count`` and of them the experts'), which the memory prediction
needs before anything runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ds_bench.workloads import llama_shapes, moe_shapes
from ds_bench.workloads.gpt2_shapes import SHAPES, VOCAB, Shape, custom_shape, gpt2_param_count, named_shape

FAMILIES = {"gpt3": "gpt2", "llama3": "llama"}
"""Named family -> the workload whose sizes it is."""
SCALES = ("layers", "hidden", "seq")


@dataclass(frozen=True)
class Member:
    name: str
    """``gpt3-1.3b``, or ``L x H x A`` for a scaled shape."""
    run_args: tuple[str, ...]
    layers: int
    hidden: int
    heads: int
    params: int
    largest_layer_params: int
    """The token embedding, V x H: the largest single parameter (the sweep's prediction uses it for
    ZeRO-3's gathered layer)."""
    vocab: int = 0
    """Rows of the embedding and the LM head: the loss's width (``perf.seq_memory``)."""
    seq_len: int = 0
    """The member's own ``--seq-len`` (``--scale seq``); 0: the search's."""
    expert_params: int = 0
    """Of ``params``, the experts' (``moe_shapes.expert_param_count``): what ``--expert-parallel`` shards."""


def member(name: str, run_args: tuple[str, ...], shape: Shape) -> Member:
    return Member(name, run_args, shape.n_layer, shape.n_embd, shape.n_head,
                  gpt2_param_count(shape.n_layer, shape.n_embd, VOCAB, shape.n_positions),
                  max(VOCAB, shape.n_positions, 4 * shape.n_embd) * shape.n_embd, VOCAB)


def llama_member(name: str, run_args: tuple[str, ...], shape: llama_shapes.LlamaShape) -> Member:
    return Member(name, run_args, shape.n_layer, shape.hidden, shape.heads, llama_shapes.param_count(shape),
                  max(shape.vocab, shape.intermediate) * shape.hidden, shape.vocab)


def moe_member(name: str, run_args: tuple[str, ...], shape: moe_shapes.MoEShape) -> Member:
    return Member(name, run_args, shape.n_layer, shape.hidden, shape.heads, moe_shapes.param_count(shape),
                  moe_shapes.largest_layer_params(shape), shape.vocab,
                  expert_params=moe_shapes.expert_param_count(shape))


Router = tuple[int | None, int | None]
"""A moe family's ``--experts`` and ``--top-k`` (None: the shape's own, or Mixtral's 8 and 2)."""


def _custom(workload: str, name: str, args: tuple[str, ...], shape: tuple[int, int, int], seq_len: int,
            router: Router) -> Member:
    """The member ``args`` (``--layers L --hidden H --heads A``) build in ``workload``'s architecture."""
    if workload == "moe":
        return moe_member(name, args, moe_shapes.run_shape(None, *shape, *router))
    if workload == "llama":
        return llama_member(name, args, llama_shapes.custom_shape(*shape))
    return member(name, args, custom_shape(*shape, seq_len))


def named_family(family: str, seq_len: int) -> list[Member]:
    """The named sizes of ``family`` (``gpt3``, ``llama3``), smallest first."""
    if FAMILIES[family] == "llama":
        out = [llama_member(name, ("--size", name), shape) for name, shape in llama_shapes.SHAPES.items()
               if name.startswith(family)]
    else:
        out = [member(name, ("--size", name), named_shape(name, seq_len)) for name in SHAPES
               if name.startswith(f"{family}-")]
    return sorted(out, key=lambda m: m.params)


def scaled_family(scale: str, layers: int, hidden: int, heads: int, max_scale: int, seq_len: int,
                  workload: str = "gpt2", router: Router = (None, None)) -> list[Member]:
    """The base shape grown k = 1 .. ``max_scale`` times along ``scale``, in ``workload``'s architecture."""
    out = []
    for k in range(1, max_scale + 1):
        shape = (k * layers, hidden, heads) if scale == "layers" else (layers, k * hidden, k * heads)
        args = ("--layers", str(shape[0]), "--hidden", str(shape[1]), "--heads", str(shape[2]))
        out.append(_custom(workload, " x ".join(map(str, shape)), args, shape, seq_len, router))
    return out


def seq_member(workload: str, model: tuple[str, ...], seq_len: int, router: Router = (None, None)) -> Member:
    """``--scale seq``'s member ``seq T``: the model ``model`` (``("--size", NAME)`` or ``("--layers", L,
    "--hidden", H, "--heads", A)``) of ``workload`` at sequence length ``seq_len`` (GPT-2's learned positions
    grow past 1,024 with it)."""
    if model[0] == "--size":
        name = model[1]
        m = (moe_member(name, model, moe_shapes.run_shape(name, None, None, None, *router)) if workload == "moe"
             else llama_member(name, model, llama_shapes.SHAPES[name]) if workload == "llama"
             else member(name, model, named_shape(name, seq_len)))
    else:
        m = _custom(workload, "", model, tuple(int(v) for v in model[1::2]), seq_len, router)
    return dataclasses.replace(m, name=f"seq {seq_len}", seq_len=seq_len)


def model_name(model: tuple[str, ...]) -> str:
    """``--size`` NAME or ``--layers L --hidden H --heads A`` as the table names them: ``tiny``, ``2 x 64 x 4``."""
    return model[1] if model[0] == "--size" else " x ".join(model[1::2])
