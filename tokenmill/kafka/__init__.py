"""tokenmill's Kafka plumbing: clients with bounded calls, the one
transaction primitive, topic and group names, committed and compacted reads,
and the KRaft broker configuration."""
