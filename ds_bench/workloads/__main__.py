"""``python -m ds_bench.workloads``: GPT-2's training FLOPs per token at each named size, seq 1024
(``ds_bench.workloads.flops.gpt2_flops_per_token``: PaLM's 6N + 12 L d T)."""

from ds_bench.workloads import flops
from ds_bench.workloads.gpt2_shapes import SHAPES

for name, (n_layer, d, _heads) in SHAPES.items():
    per_token = flops.gpt2_flops_per_token(n_layer, d, 4 * d, 50257, 1024)
    print(f"gpt2 {name:9s} seq 1024: {per_token / 1e9:7.3f} GFLOP per token trained")
