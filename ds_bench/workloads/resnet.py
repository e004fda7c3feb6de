"""ResNet image classification (He et al. 2015), built from transformers' ResNet, not torchvision.

torchvision cannot be imported on a CPU torch (its registry wheels are CUDA builds whose ``_C``
needs libtorch_cuda) and breaks transformers while installed, so the network is
``transformers.ResNetForImageClassification``. Its named
sizes are the standard ImageNet architectures, parameter for parameter (ResNet v1.5: stride in the
3x3 convolution of a bottleneck, projection shortcuts only where the shape changes); at 1000
classes: resnet18 11,689,512, resnet34 21,797,672, resnet50 25,557,032, resnet101 44,549,160,
resnet152 60,192,808 parameters, the torchvision / Keras counts.

Flags: ``--size`` (default resnet50), ``--image-size`` (default 224), ``--num-classes`` (default:
the data's class count for real data, else 1000), ``--data synthetic | IDX_FOLDER | IMAGE_FOLDER``
(see ``ds_bench.data.images``). Throughput is reported in images/s. Model FLOPs are counted from
the layer shapes (``ds_bench.workloads.flops.layer_forward_flops``), 3x the forward for training.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ds_bench.data import images
from ds_bench.data.idx import find_split
from ds_bench.errors import UserError
from ds_bench.workloads import flops
from ds_bench.workloads.base import Batch, Workload, check_enough, cycle_pool, shard_epochs

# name: (blocks per stage, output channels per stage, block type)
ARCHS: dict[str, tuple[list[int], list[int], str]] = {
    "resnet18": ([2, 2, 2, 2], [64, 128, 256, 512], "basic"),
    "resnet34": ([3, 4, 6, 3], [64, 128, 256, 512], "basic"),
    "resnet50": ([3, 4, 6, 3], [256, 512, 1024, 2048], "bottleneck"),
    "resnet101": ([3, 4, 23, 3], [256, 512, 1024, 2048], "bottleneck"),
    "resnet152": ([3, 8, 36, 3], [256, 512, 1024, 2048], "bottleneck"),
}
DEFAULT_IMAGE_SIZE = 224
DEFAULT_CLASSES = 1000
SYNTHETIC_POOL = 8  # distinct synthetic batches per rank, cycled


class ResNetWorkload(Workload):
    """Not built partitioned under ZeRO-3 (``partitioned_build`` False): its FLOPs come from a forward
    pass with hooks (``flops.layer_forward_flops``) at the image size, which needs whole weights."""

    name = "resnet"
    sizes = tuple(ARCHS)
    default_size = "resnet50"
    default_lr = 1e-3  # AdamW on a ResNet from scratch
    sample_unit = "images"
    convolutions = True

    def __init__(self, cfg):
        super().__init__(cfg)
        if cfg.model_path is not None:
            raise UserError("--model is not used by workload resnet (no pretrained weights are loaded)")
        self.image_size = cfg.image_size or DEFAULT_IMAGE_SIZE
        self.data_format = None if cfg.data == "synthetic" else images.detect_format(cfg.data)
        data_classes = images.num_classes(cfg.data, self.data_format) if self.data_format else None
        self.num_classes = cfg.num_classes or data_classes or DEFAULT_CLASSES
        if data_classes and data_classes > self.num_classes:
            raise UserError(f"--num-classes {self.num_classes} is fewer than the {data_classes} classes "
                            f"in --data {cfg.data}")
        self.source: tuple[int, images.Fetch] | None = None  # (samples, fetch), set by load_data

    def build_model(self) -> nn.Module:
        from transformers import ResNetForImageClassification

        model = ResNetForImageClassification(resnet_config(self.size, self.num_classes))
        return model.to(memory_format=torch.channels_last) if self.cfg.channels_last else model

    def load_data(self, world_size: int, micro_batch: int) -> None:
        """idx: both files read and paired; image folder: loaded and its first image decoded."""
        if self.data_format is None:
            return
        path = self.cfg.data
        if self.source is None:
            if self.data_format == "idx":
                self.source = images.idx_source(path)
            else:
                self.source = images.folder_source(path, self.image_size)
        n = self.source[0]
        where = find_split(path, "train")[0] if self.data_format == "idx" else "the class folders"
        check_enough(n, world_size, micro_batch, f"--data {path}: {n} images in {where}")

    def batches(self, rank: int, world_size: int, micro_batch: int) -> Iterator[Batch]:
        if self.data_format is None:
            return cycle_pool(self._synthetic_pool(rank, micro_batch))
        self.load_data(world_size, micro_batch)
        n, fetch = self.source
        indices = shard_epochs(n, rank, world_size, micro_batch, self.cfg.seed)
        return images.batches(fetch, indices, self.image_size)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        pixels = batch["pixel_values"]
        if self.cfg.channels_last:  # in the step, as a training script converts its loader's batches
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        logits = model(pixel_values=pixels, return_dict=True).logits
        return F.cross_entropy(logits.float(), batch["labels"])

    def model_flops_per_sample(self, model: nn.Module) -> float:
        """3 x the forward FLOPs of Conv2d and Linear layers at this image size (ds_bench.workloads.flops)."""
        param = next(model.parameters())
        x = torch.zeros(1, 3, self.image_size, self.image_size, dtype=param.dtype, device=param.device)
        return flops.TRAIN_FACTOR * flops.layer_forward_flops(model, lambda: model(pixel_values=x))

    def model_settings(self, model: nn.Module) -> dict[str, str]:
        """``memory_format`` of the first convolution's weight as the engine left it: ``channels_last``,
        ``contiguous``, or ``partitioned`` (ZeRO-3 holds a flat shard)."""
        weight = next(m.weight for m in model.modules() if isinstance(m, nn.Conv2d))
        if weight.dim() != 4:
            return {"memory_format": "partitioned"}
        nhwc = weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
        return {"memory_format": "channels_last" if nhwc else "contiguous"}

    def _synthetic_pool(self, rank: int, micro_batch: int) -> list[Batch]:
        """ImageNet-shaped batches: normalized pixels ~ N(0, 1), uniform labels; seeded per rank."""
        gen = torch.Generator().manual_seed(self.cfg.seed * 1000 + rank)
        shape = (micro_batch, 3, self.image_size, self.image_size)
        return [{"pixel_values": torch.randn(shape, generator=gen),
                 "labels": torch.randint(0, self.num_classes, (micro_batch,), generator=gen)}
                for _ in range(SYNTHETIC_POOL)]


def resnet_config(size: str, num_classes: int):
    """The ``transformers.ResNetConfig`` of a named standard ResNet (v1.5, 64-channel stem)."""
    from transformers import ResNetConfig

    depths, hidden_sizes, layer_type = ARCHS[size]
    return ResNetConfig(depths=depths, hidden_sizes=hidden_sizes, layer_type=layer_type, num_labels=num_classes,
                      embedding_size=64, downsample_in_first_stage=False, downsample_in_bottleneck=False)
