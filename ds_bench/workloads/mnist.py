"""MNIST CNN: the classic PyTorch example network on 28x28 grey digits.

Two 3x3 convolutions (32, 64 channels), 2x2 max-pool and a two-layer linear head, as in
pytorch/examples mnist/main.py, without dropout so runs are deterministic across ZeRO stages.
Data: seeded synthetic MNIST-shaped tensors, or a folder of idx files (MNIST, Fashion-MNIST).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ds_bench.data.idx import find_split, load_split
from ds_bench.workloads import flops
from ds_bench.workloads.base import Batch, Workload, check_enough, cycle_pool, shard_epochs

MEAN, STD = 0.1307, 0.3081  # MNIST pixel statistics used by pytorch/examples
SYNTHETIC_POOL = 8  # distinct synthetic batches per rank, cycled


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> the float inputs pytorch/examples trains on."""
    return (images.float() / 255.0 - MEAN) / STD


class MnistCNN(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(64 * 12 * 12, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class MnistWorkload(Workload):
    """Not built partitioned under ZeRO-3 (``partitioned_build`` False): its FLOPs come from a forward
    pass with hooks (``flops.layer_forward_flops``), which needs whole weights; the model is tiny anyway."""

    name = "mnist"
    default_lr = 1e-3
    sample_unit = "images"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.images: torch.Tensor | None = None  # uint8 [N, 1, 28, 28], set by load_data; normalized per batch
        self.labels: torch.Tensor | None = None

    def build_model(self) -> nn.Module:
        return MnistCNN()

    def load_data(self, world_size: int, micro_batch: int) -> None:
        if self.cfg.data == "synthetic":
            return
        if self.images is None:
            images, self.labels = load_split(self.cfg.data, "train")
            self.images = images.unsqueeze(1)  # 47 MB as bytes; as normalized floats, 188 MB in every rank's peak
        images_file = find_split(self.cfg.data, "train")[0]
        check_enough(len(self.images), world_size, micro_batch,
                     f"--data {self.cfg.data}: {len(self.images)} images in {images_file}")

    def batches(self, rank: int, world_size: int, micro_batch: int) -> Iterator[Batch]:
        if self.cfg.data == "synthetic":
            return cycle_pool(self._synthetic_pool(rank, micro_batch))
        self.load_data(world_size, micro_batch)
        return self._real_batches(rank, world_size, micro_batch)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(model(batch["x"]).float(), batch["y"])

    def model_flops_per_sample(self, model: nn.Module) -> float:
        """3 x the forward FLOPs of the two convolutions and two linear layers (ds_bench.workloads.flops).

        By shape: conv1 2*1*9*32*26*26, conv2 2*32*9*64*24*24, fc1 2*9216*128, fc2 2*128*10,
        about 23.97 MFLOP forward, 71.9 MFLOP per trained image.
        """
        param = next(model.parameters())
        x = torch.zeros(1, 1, 28, 28, dtype=param.dtype, device=param.device)
        return flops.TRAIN_FACTOR * flops.layer_forward_flops(model, lambda: model(x))

    def _synthetic_pool(self, rank: int, micro_batch: int) -> list[Batch]:
        gen = torch.Generator().manual_seed(self.cfg.seed * 1000 + rank)
        return [{"x": (torch.rand(micro_batch, 1, 28, 28, generator=gen) - MEAN) / STD,
                 "y": torch.randint(0, 10, (micro_batch,), generator=gen)}
                for _ in range(SYNTHETIC_POOL)]

    def _real_batches(self, rank: int, world_size: int, micro_batch: int) -> Iterator[Batch]:
        for idx in shard_epochs(len(self.images), rank, world_size, micro_batch, self.cfg.seed):
            yield {"x": normalize(self.images[idx]), "y": self.labels[idx]}
