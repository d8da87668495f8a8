"""A local stack without Docker: a real Apache Kafka broker built from the
jars Maven Central publishes, and an S3 API server (moto)."""
