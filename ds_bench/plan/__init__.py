"""``ds-bench plan``: the best layouts for a model on a cluster, predicted (``ds_bench.perf``), recorded, and with
``--confirm`` the best ones run for real beside their prediction."""
