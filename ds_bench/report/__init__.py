"""Turning records into what people read: run summaries, the sweep ranking and tables, scaling tables, plots, the comm-bound verdict, and ``ds-bench report``."""
