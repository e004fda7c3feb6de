"""The expectations file (``--expect FILE``, YAML or JSON): what a cluster must measure to pass.

One file holds a list of expectations; each names a record kind, a metric of it, which measurements it
is about (``where``: fields that must be equal; ``hardware``: a piece of the device's name; for comm rows
``min_size_bytes``) and a bound (``at_least`` or ``at_most``), with where the bound came from (``source``).
``load`` checks a file against these models before anything runs; an error is one line naming the file
and the entry. ``json_schema`` is ``docs/expect.schema.json`` (``ds-bench schema expect``); the metrics
and fields each kind has are ``METRICS`` and ``FIELDS`` (``ds_bench.record.expect_check`` reads them).
"""

from __future__ import annotations

import json
import os
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ds_bench.config.degrees import DEGREES
from ds_bench.errors import UserError

METRICS: dict[str, dict[str, str]] = {
    "run": {"samples_per_s": "samples/s", "tokens_per_s": "tokens/s", "samples_per_s_per_device": "samples/s",
            "tflops_per_device": "TFLOP/s", "mfu": "fraction", "mfu_vs_measured": "fraction",
            "step_ms_median": "ms", "step_ms_p90": "ms", "peak_mem_bytes": "bytes"},
    "sweep_point": {"throughput": "", "peak_mem_bytes": "bytes"},
    "comm": {"busbw_GBps": "GB/s", "algbw_GBps": "GB/s", "time_us": "us"},
    "scaling": {"efficiency": "fraction", "samples_per_s_per_device": "samples/s",
                "tokens_per_s_per_device": "tokens/s", "samples_per_s": "samples/s", "step_ms_median": "ms"},
    "capacity": {"params": "parameters", "peak_mem_bytes": "bytes", "tokens_per_s": "tokens/s"},
    "doctor": {"busbw_GBps": "GB/s", "allreduce_ms": "ms"},
}
"""Kind -> metric -> unit ("": the record's own, e.g. a sweep point's ``unit``). The metric is the record's own
field (its docstring in the record schema)."""

FIELDS: dict[str, tuple[str, ...]] = {
    "run": ("workload", "size", "zero_stage", "precision", "world_size", "engine", "micro_batch", "launcher", "tag",
            "layout_key"),
    "sweep_point": ("workload", "size", "world_size", "key", "stage", "offload", "precision", "micro_batch"),
    "comm": ("collective", "scope", "group", "size_bytes", "dtype", "world_size", "backend"),
    "scaling": ("workload", "world_size", "nodes", "launcher"),
    "capacity": ("family", "layout", "world_size", "stage", "offload", "precision"),
    "doctor": ("world_size",),
}
"""Kind -> the fields ``where`` may name beside the parallel degrees (``fields_of``)."""
WITH_DEGREES = ("run", "capacity")
"""The kinds whose records name a layout: ``where`` may name each registered degree too, by its field."""


def fields_of(kind: str) -> tuple[str, ...]:
    """The fields an expectation's ``where`` may name for ``kind``: ``FIELDS``, and every registered parallel degree
    (``ds_bench.config.degrees``) where the kind's records name a layout."""
    return FIELDS[kind] + (DEGREES.fields() if kind in WITH_DEGREES else ())

NAMES_DEVICE = ("run", "comm", "doctor")
"""The kinds whose records name the device they measured (``hardware`` can select them)."""

Scalar = Union[bool, int, float, str]


class Expectation(BaseModel):
    """One bound on one metric of the measurements that match."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = Field(min_length=1)
    """What it checks, as a person says it: ``all_reduce busbw at >= 1 GiB on 8x H100 (NVLink)``."""
    kind: Literal["run", "sweep_point", "comm", "scaling", "capacity", "doctor"]
    """The record kind the measurement is in."""
    metric: str
    """A metric of that kind (``METRICS``)."""
    at_least: float | None = None
    """The measured value must be >= this (throughput, bandwidth, efficiency)."""
    at_most: float | None = None
    """The measured value must be <= this (times, memory)."""
    where: dict[str, Scalar] = Field(default_factory=dict)
    """Fields that must equal these values (``FIELDS`` of the kind)."""
    hardware: str | None = None
    """A piece of the device's name the measurement must show (case-insensitive): ``H100``, ``H200``. Run,
    comm and doctor records name their device; for the others select by ``where``."""
    min_size_bytes: int | None = Field(default=None, ge=0)
    """Comm only: rows of at least this message size."""
    required: bool = False
    """A measurement that must be there: without one the expectation fails (else it is "not measured")."""
    reduce: Literal["median", "min", "max"] = "median"
    """How the matching measurements become one value (repeats, sizes, rows)."""
    source: str | None = None
    """Where the bound comes from: a citation, a baseline run."""

    @model_validator(mode="after")
    def _consistent(self) -> "Expectation":
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError("give exactly one of at_least and at_most")
        if self.metric not in METRICS[self.kind]:
            raise ValueError(f"metric {self.metric!r} is not one of {self.kind}'s: {', '.join(METRICS[self.kind])}")
        unknown = sorted(set(self.where) - set(fields_of(self.kind)))
        if unknown:
            raise ValueError(f"where: {', '.join(unknown)} not among {self.kind}'s fields: {', '.join(fields_of(self.kind))}")
        if self.hardware is not None and self.kind not in NAMES_DEVICE:
            raise ValueError(f"hardware: {self.kind} records do not name their device (only "
                             f"{', '.join(NAMES_DEVICE)} do); select by where")
        if self.min_size_bytes is not None and self.kind != "comm":
            raise ValueError("min_size_bytes is for comm expectations only")
        return self

    def bound_text(self) -> str:
        unit = METRICS[self.kind][self.metric]
        unit = "" if unit in ("", "fraction") else f" {unit}"
        return f">= {self.at_least:g}{unit}" if self.at_least is not None else f"<= {self.at_most:g}{unit}"

    def passes(self, value: float) -> bool:
        return value >= self.at_least if self.at_least is not None else value <= self.at_most


class ExpectFile(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    description: str | None = None
    """What the file is for: the cluster, the hardware, the baseline."""
    expectations: list[Expectation] = Field(min_length=1)


def json_schema() -> dict:
    """JSON Schema (draft 2020-12) of an expectations file."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "ds_bench expectations",
            **ExpectFile.model_json_schema()}


def load(path: str, flag: str = "--expect") -> ExpectFile:
    """The checked file; ``UserError`` (one line: the file, the entry by index and name, what is wrong)."""
    if not os.path.isfile(path):
        raise UserError(f"{flag} {path}: no such file")
    data = _decode(path, flag)
    try:
        return ExpectFile.model_validate(data)
    except ValidationError as e:
        raise UserError(f"{flag} {path}: {_first_problem(e, data)}") from None


def _decode(path: str, flag: str):
    kind = "JSON" if path.endswith(".json") else "YAML"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:  # a binary file (an image, a zip, a UTF-16 export)
        raise UserError(f"{flag} {path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                        f"expected a {kind} expectations file") from None
    if path.endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{flag} {path}: line {e.lineno}: not JSON: {e.msg}") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise UserError(f"{flag} {path}: {where}not YAML: {getattr(e, 'problem', None) or e}") from None


def _first_problem(error: ValidationError, data) -> str:
    """``expectations[2] ("all_reduce busbw"): at_least: Input should be a valid number``."""
    problem = error.errors()[0]
    loc = list(problem["loc"])
    message = problem["msg"].removeprefix("Value error, ")
    if len(loc) >= 2 and loc[0] == "expectations" and isinstance(loc[1], int):
        entry = data["expectations"][loc[1]]
        name = entry.get("name") if isinstance(entry, dict) else None
        head = f"expectations[{loc[1]}]" + (f" ({name!r})" if name else "")
        rest = ".".join(str(part) for part in loc[2:])
        return f"{head}: {rest + ': ' if rest else ''}{message}"
    if not isinstance(data, dict):
        return "expected a mapping with an 'expectations' list"
    return f"{'.'.join(str(part) for part in loc) or 'the file'}: {message}"
