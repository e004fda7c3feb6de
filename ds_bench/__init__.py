"""ds_bench: DeepSpeed benchmarking harness."""
