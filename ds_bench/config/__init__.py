"""What to run: the run configuration and its flags, the studies' shared flags (``study_flags``), shared flag
parsers, pre-flight checks, the parallel degrees (``degrees/``) and the DeepSpeed JSON (``deepspeed/``)."""
