"""What ``--compile`` cost and whether it settled, from dynamo's own counters (``torch._dynamo.utils``).

A compiled run compiles in its first step (forward and backward graphs, one per frame between graph
breaks); a later compile is a recompilation (a guard failed: a new shape, dtype or grad mode). The
run's warm-up must absorb every compile: one inside the measured window would time the compiler,
not the model, so such a run is failed (``inside_window``). Marks are taken on every rank:

  compile_s        dynamo's ``entire_frame_compile`` + ``entire_backward_compile`` (wall s, this rank)
  frames_compiled  frames dynamo compiled (``counters["frames"]["ok"]``)
  graphs           FX graphs handed to the backend (``counters["stats"]["unique_graphs"]``)
  graph_breaks     graph breaks (``counters["graph_break"]``, summed over reasons)
  recompilations   frames compiled after the first step (warm-up and window)
"""

from __future__ import annotations

from dataclasses import dataclass, field


def counts() -> dict:
    """This process's dynamo counters now (the module is loaded by any compiled run anyway)."""
    from torch._dynamo.utils import calculate_time_spent, counters

    return {"frames": counters["frames"]["ok"], "graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": counters["graph_break"].total(),
            "compile_s": calculate_time_spent().get("total_wall_time", 0.0)}


@dataclass
class CompileWatch:
    """Counter marks at the loop's start, after its first step, at the window's open and at its end."""

    marks: dict = field(default_factory=dict)

    def mark(self, name: str) -> None:
        self.marks[name] = counts()

    def after_step(self, done: int) -> None:
        if done == 1:
            self.mark("first_step")

    def block(self) -> dict:
        """The record's ``compile`` block (pure over the marks)."""
        return summarize(self.marks)


def summarize(marks: dict) -> dict:
    start, end = marks["start"], marks["end"]
    after_first = marks.get("first_step", end)
    return {"compile_s": end["compile_s"] - start["compile_s"], "frames_compiled": end["frames"] - start["frames"],
            "graphs": end["graphs"] - start["graphs"], "graph_breaks": end["graph_breaks"] - start["graph_breaks"],
            "recompilations": end["frames"] - after_first["frames"],
            "inside_window": end["frames"] - marks.get("window", end)["frames"]}


def combine(per_rank: list[dict], backend: str) -> dict:
    """The record's ``compile`` block from every rank's ``summarize`` (pure): rank 0's counts and time,
    the slowest rank's time, and every rank's most recompilations and compiles inside the window."""
    first = per_rank[0]
    return {"backend": backend, "compile_s": first["compile_s"], "compile_s_max": max(r["compile_s"] for r in per_rank),
            "frames_compiled": first["frames_compiled"], "graphs": first["graphs"], "graph_breaks": first["graph_breaks"],
            "recompilations": max(r["recompilations"] for r in per_rank),
            "inside_window": max(r["inside_window"] for r in per_rank)}


def check_settled(per_rank: list[dict], warmup: int) -> None:
    """Every rank's compiles ended before the window opened; else the run fails (it would time the compiler)."""
    late = {rank: r["inside_window"] for rank, r in enumerate(per_rank) if r["inside_window"]}
    if late:
        raise RuntimeError(f"torch.compile compiled {sum(late.values())} frame(s) inside the measured steps "
                           f"(ranks {sorted(late)}): they recompiled after {warmup} warm-up step(s); "
                           "raise --warmup or remove what changes between steps")
