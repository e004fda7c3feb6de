"""Does ``torch.compile`` compute the gradients eager PyTorch computes, for ds_bench's MNIST CNN?

Prints, per parameter, the sum of |gradient| after one forward/backward on the same batch: eager, then
compiled with each backend. Found with it (torch 2.13.0+cpu, AMD EPYC AVX2 image, 2026-11-24): inductor
gives all-zero gradients to both convolutions of the CNN (fc1 128 or 64 wide; 256 wide is right), which
``--compile`` under DeepSpeed trains with (the loss then drifts from eager's from the second step);
``aot_eager`` is exact, so the fault is inductor's generated code. Run: ``.venv/bin/python
tools/compile_grad_check.py [BACKEND ...]`` (default: inductor aot_eager).
"""

from __future__ import annotations

import copy
import os
import sys

os.environ["TORCHDYNAMO_DISABLE"] = "0"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ds_bench.workloads.mnist import MnistCNN  # noqa: E402


def grad_sums(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    F.cross_entropy(model(x), y).backward()
    return {name: p.grad.abs().sum().item() for name, p in model.named_parameters()}


def main(backends: list[str]) -> int:
    torch.manual_seed(0)
    eager = MnistCNN()
    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    columns = {"eager": grad_sums(copy.deepcopy(eager), x, y)}
    for backend in backends:
        model = copy.deepcopy(eager)
        model.compile(backend=backend)
        columns[backend] = grad_sums(model, x, y)
    print(f"torch {torch.__version__}; sum of |grad| per parameter after one step (batch 32)")
    print(f"{'parameter':<14}" + "".join(f"{name:>16}" for name in columns))
    wrong = 0
    for name, reference in columns["eager"].items():
        print(f"{name:<14}" + "".join(f"{col[name]:>16.6g}" for col in columns.values()))
        wrong += sum(abs(col[name] - reference) > 1e-3 * reference for col in columns.values())
    print(f"{wrong} gradient(s) differ from eager by more than 0.1%")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["inductor", "aot_eager"]))
