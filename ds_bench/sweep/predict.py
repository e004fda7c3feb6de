"""TEMPORARY placeholder (replaced by the real module on merge)."""
from __future__ import annotations
import os
from dataclasses import dataclass

@dataclass(frozen=True)
class ModelShape:
    params: int
    largest_layer_params: int

def calibrate(record, point, world_size, ranks_per_node, device_type):
    return None

def predict_peak_bytes(shape, point, world_size, ranks_per_node, device_type, calibration):
    return None

def device_capacity_bytes(device_type, ranks_per_node, cpu_mem_limit):
    if cpu_mem_limit:
        return cpu_mem_limit
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // ranks_per_node
