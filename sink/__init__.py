"""The sink: `tokenmill.<run>.completions` -> S3 (JSONL batches) and the
dead-letter topic, exactly once.

One job per module:

- `routing`: which records go to the DLQ and why (pure);
- `samples`: a completion as one self-contained training-sample line (pure;
  also the raw-JSON hot path that writes the same bytes);
- `object_keys`: S3 key layout (pure);
- `objects`: an object's body (JSONL, optionally zstd) and metadata (pure);
- `batcher`: per-partition batches and the rotation predicates (pure);
- `counters`: the cumulative `SinkProgress` counters (pure);
- `dlq`: dead-letter records and their headers (pure);
- `s3_writer`: boto3 uploads, multipart, retries, conditional writes;
- `store_check`: the start-up check of what conditional writes the S3 store
  honours (refuses a store without them, adapts the writer to its quirks);
- `committer`: what a flush transaction holds (the protocol is tokenmill/kafka/transactions.py);
- `metrics`: Prometheus metrics on a private registry;
- `config`: the resolved settings of one instance; `errors`: the exceptions;
- `service`: the consumer loop that ties them together;
- `command`: the `tokenmill sink` CLI.
"""
