"""A lineage's dataset: which run's accepted result each prompt of the root takes
(`tokenmill dataset`, lineage coverage in `tokenmill status`, `tokenmill export`)."""
