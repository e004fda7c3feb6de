"""``ds-bench capacity``: the largest model of a family that trains on these ranks, per layout."""
