"""The performance model: a layout's step time, memory per rank and MFU at any scale, from the model's shape,
the cluster's figures (datasheet, or this cluster's own records) and the layout (pure functions; docs/plan.md);
the same model states calibrated on measured runs for the studies' memory predictions (``states``,
``peak_memory``, ``seq_memory``), each collective's bus bytes with a run's comm-bound verdict
(``bus_bytes``, ``comm_bound``), and the grids of layouts the studies (``grid``) and plan (``space``) cover."""
