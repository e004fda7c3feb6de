"""``ds-bench comm``: collective bandwidth and correctness on the ranks a launcher started.

Stages of its data flow, one module each: ``spec`` (flags into a checked ``CommSpec``),
``bandwidth`` (sizes and the nccl-tests bandwidth formulas, pure), ``patterns`` (inputs whose exact
result is known, and the check), ``timing`` (the timed loop on the process group), ``topology`` and
``pairs`` (the links inside and across hosts), ``table`` (rows, table, plot, the ``--expect-busbw`` gate)
and ``main`` (prepare, execute, record); ``doctor`` is ``ds-bench doctor``.
"""
