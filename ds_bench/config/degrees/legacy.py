"""Run records written before the degrees had one map: where each of the first four degrees kept its size, its
settings and its collectives at the record's top level, and the ``degrees`` map they are read as
(``ds_bench.record.run_schema.RunRecord``). A degree added since writes only the map, so nothing here grows."""

from __future__ import annotations

PIPELINE_SETTINGS = ("micro_batches", "partition", "schedule_bubble")
LOAD_KEYS = ("load_max_over_mean", "load_max_over_mean_worst", "dropped_share")
OLD_COMM = {"tensor_parallel": ("tensor_parallel_comm", "all_reduce"),
            "sequence_parallel": ("sequence_parallel_comm", "all_to_all"),
            "expert_parallel": ("expert_parallel_comm", "all_to_all")}
OLD_KEYS = ("pipeline_stages", *PIPELINE_SETTINGS, *OLD_COMM, *(key for key, _ in OLD_COMM.values()))


def _comm(old: dict | None, collective: str) -> dict | None:
    if not old or old.get(f"{collective}_ms") is None and not old.get("calls_per_step"):
        return None
    return {"collective": collective, "ms_per_step": old.get(f"{collective}_ms"),
            "calls_per_step": old.get("calls_per_step"), "share_of_step": old.get("share_of_step"),
            "bytes_per_step": old.get("bytes_per_step")}


def migrate(data: dict) -> dict:
    """``data`` (a run record as read) with its old top-level degree keys moved into ``degrees`` (pure); a record
    with a ``degrees`` map, or none of the old keys, as it is."""
    if "degrees" in data or not any(key in data for key in OLD_KEYS):
        return data
    data, degrees = dict(data), {}
    old = {key: data.pop(key, None) for key in OLD_KEYS}
    if old["pipeline_stages"] is not None:
        degrees["pipeline_stages"] = {"size": old["pipeline_stages"],
                                      "settings": {key: old[key] for key in PIPELINE_SETTINGS}}
    for field, (comm_key, collective) in OLD_COMM.items():
        size, comm = old[field], old[comm_key]
        if size is None:
            continue
        block = {"size": size, "comm": _comm(comm, collective)}
        if isinstance(size, dict):  # the experts' block: their layout and router, the size among them
            block = {"size": size["size"], "settings": {k: v for k, v in size.items() if k != "size"},
                     "comm": _comm(comm, collective),
                     "measured": {k: comm[k] for k in LOAD_KEYS if k in comm} if comm else None}
        degrees[field] = block
    data["degrees"] = degrees or None
    return data
