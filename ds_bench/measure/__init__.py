"""Measuring a run: the timed loop, metrics reduced over ranks, peaks and MFU, slow ranks, checkpoint I/O."""
