"""``ds-bench sweep``: which ZeRO stage / offload / precision / micro-batch to use, measured.

The data flow, one module per stage:
- ``spec``: the sweep's axes and options, validated at load (``SweepSpec``); ``preset``: this machine's
  default sweep; ``common_args``: every point's run arguments;
- ``prune``: ``--prune-predicted``, the grid ranked by ``ds-bench plan``'s model;
- ``driver``: the one place points are launched (through ``ds_bench.jobs.runner``), skipped on their
  predicted memory (``ds_bench.perf.peak_memory``), timed out, interrupted and recorded (``point_record``,
  ``progress``); ``main``: the command.
The ranked table, the recommendation and the plots are ``ds_bench.report``'s.
"""
