"""This machine: accelerator, DeepSpeed JIT ops and their toolchain, locks, shared memory, memory caps, CPU features."""
