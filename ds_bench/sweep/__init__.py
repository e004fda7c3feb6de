"""``ds-bench sweep``: which ZeRO stage / offload / precision / micro-batch to use, measured.

The data flow, one module per stage:
- ``spec``: the sweep's axes and options, validated at load (``SweepSpec``);
- ``points``: the grid of points (pure), each one configuration to run;
- ``derive``: a point's DeepSpeed config from the base config (pure);
- ``predict``: each point's peak memory per rank, predicted before it is launched;
- ``outcome``: what became of a launched point (ok / oom / timeout / crashed), from its records
  and exit status, and whether the machine was busy meanwhile;
- ``driver``: the one place points are launched, timed out, interrupted and recorded;
- ``rank``, ``table``, ``plots``: the ranked table, the recommendation and the figures.
"""
