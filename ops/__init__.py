"""Operator commands: what an operator runs against a run (status, spot-check,
the run registry, replays), beside the services and the shared plumbing in
`tokenmill/`. Services never import from here."""
