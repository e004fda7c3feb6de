"""``ds-bench run``: one benchmark run as every rank executes it (resolve -> join -> measure -> record)."""
