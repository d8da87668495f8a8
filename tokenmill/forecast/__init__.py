"""Forecast arithmetic shared by `tokenmill plan` (ops) and `tokenmill produce`
(which stores a plan's prediction as the run's estimate): answer lengths from
a sample, the throughput curve, makespan, hours and cost. Pure functions."""
