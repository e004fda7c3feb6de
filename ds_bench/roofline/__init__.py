"""``ds-bench roofline``: the measured ceiling of every device of a job."""
