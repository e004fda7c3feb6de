"""``ds-bench run``: one benchmark run as every rank executes it (prepare -> measure -> record)."""
