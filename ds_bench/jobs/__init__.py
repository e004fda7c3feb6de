"""Job execution for the commands that start jobs (sweep, scaling, capacity, plan's confirmation): launch
commands, spawning a job here or as a Slurm job and reading back its outcome, the ledger of a study's jobs;
``ds-bench launch``. Their flags are ``ds_bench.config.study_flags``, their grid ``ds_bench.perf.grid``, their
memory prediction ``ds_bench.perf``'s, the ``--expect`` gate ``ds_bench.record.expect_gate``."""
