"""`tokenmill plan`: measure one server with a sample of the dataset and
predict time, tokens, truncation and cost before the GPUs are rented.

Modules: dataset (read + sample, through the producer's own reading),
sampling (stratified sample), calibrate (the HTTP sweep), rates (tokens/s per
concurrency level from whole requests), fit (throughput curve and knee),
build (measurements -> Plan), report (tables), runner, command. The
arithmetic shared with `produce --plan` is in tokenmill/forecast/.
"""
