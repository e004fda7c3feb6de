"""The parallel degrees, one module each, registered once in key order (``protocol.DEGREES``): a new degree is a
module here and a line below. ``pairs`` says which two do not compose."""

from ds_bench.config.degrees.expert import EXPERT
from ds_bench.config.degrees.pipeline import PIPELINE
from ds_bench.config.degrees.protocol import DEGREES, Degree, DegreeRule, active
from ds_bench.config.degrees.sequence import SEQUENCE
from ds_bench.config.degrees.tensor import TENSOR

for _degree in (PIPELINE, TENSOR, SEQUENCE, EXPERT):
    DEGREES.register(_degree)

__all__ = ["DEGREES", "Degree", "DegreeRule", "active"]
