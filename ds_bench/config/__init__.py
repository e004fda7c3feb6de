"""What to run: the run configuration and its flags, shared flag parsers, pre-flight checks, and the DeepSpeed JSON (``deepspeed/``)."""
