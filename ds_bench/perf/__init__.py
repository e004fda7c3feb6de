"""The performance model: a layout's step time, memory per rank and MFU at any scale, from the model's shape,
the cluster's figures (datasheet, or this cluster's own records) and the layout (pure functions; docs/plan.md)."""
