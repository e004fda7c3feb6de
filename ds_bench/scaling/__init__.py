"""``ds-bench scaling``: one configuration at 1, 2, 4, ... ranks (or the first 1, 2, ... nodes of a
hostfile), weak scaling: per-device throughput and efficiency relative to the smallest run.

The data flow, one module per stage:
- ``spec``: flags into a checked ``ScalingSpec`` (every bad value is one line, exit 2, before
  anything is launched or written);
- ``points``: the points to run and how each is launched (pure: world sizes, sub-hostfiles,
  threads per CPU rank, tags);
- ``efficiency``: a point's row from its run record, and the weak-scaling efficiency (pure);
- ``main``: check, execute (each point a fresh job through ``ds_bench.jobs.runner``), record;
- ``report``: the table (with a units legend) and the plot.
"""
