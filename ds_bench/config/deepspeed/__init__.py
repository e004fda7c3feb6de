"""The DeepSpeed JSON config: loading, overrides, sections, keys, optimizer and scheduler resolution."""
