"""`tokenmill export`: a lineage's dataset as training files (OpenAI messages,
ShareGPT, SpecForge, Parquet), sharded, checksummed, resumable."""
