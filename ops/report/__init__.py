"""`tokenmill report`: a run's or a lineage's dataset as charts on one page."""
