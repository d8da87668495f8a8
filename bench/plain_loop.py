"""The baseline of the consumer, fleet and seed-run benchmarks: the seed run's loop.

Reads request bodies (one JSON object per line, the exact bodies tokenmill
sends), posts them to one or more servers from one shared queue,
`--concurrency` requests at a time per server, and prints one JSON line:
answers, completion tokens, and the wall clock (epoch seconds) of the last
answer. With `--s3-bucket`, it also does what the seed's script did with
the answers: JSONL batches of `--batch-size` (500) lines, each uploaded to
S3 as it fills (in a thread, so the loop goes on), and the remainder at the
end; `last_at` is then the end of the last upload. No Kafka, no retries, no
bookkeeping; it imports nothing from tokenmill, so its start-up is a bare
aiohttp script's.

    python bench/plain_loop.py --bodies bodies.jsonl --url http://127.0.0.1:30000 --concurrency 64
        [--s3-bucket B --s3-endpoint-url URL --s3-prefix baseline/ --batch-size 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import aiohttp


class Batches:
    """Answers as JSONL lines, uploaded to S3 `size` at a time."""

    def __init__(self, bucket: str, endpoint: str | None, prefix: str, size: int) -> None:
        import boto3

        self.client = boto3.client("s3", endpoint_url=endpoint)
        self.bucket, self.prefix, self.size = bucket, prefix, size
        self.lines: list[bytes] = []
        self.uploads: list[asyncio.Task[None]] = []
        self.objects = 0
        self.bytes = 0

    def add(self, body: bytes, answer: dict[str, Any]) -> None:
        request = json.loads(body)
        choice = answer["choices"][0]
        self.lines.append(json.dumps({
            "messages": request["messages"], "tools": request.get("tools"),
            "answer": choice["message"], "finish_reason": choice["finish_reason"],
            "usage": answer["usage"]}).encode())
        if len(self.lines) >= self.size:
            self.flush()

    def flush(self) -> None:
        if not self.lines:
            return
        data = b"\n".join(self.lines) + b"\n"
        key = f"{self.prefix}completions_{self.objects:06d}.jsonl"
        self.lines = []
        self.objects += 1
        self.bytes += len(data)
        self.uploads.append(asyncio.ensure_future(asyncio.to_thread(
            self.client.put_object, Bucket=self.bucket, Key=key, Body=data)))

    async def close(self) -> None:
        self.flush()
        await asyncio.gather(*self.uploads)


async def run(urls: list[str], bodies: list[bytes], concurrency: int,
              batches: Batches | None = None) -> dict[str, float]:
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    answers, tokens, last = 0, 0, time.time()
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def lane(url: str) -> None:
            nonlocal answers, tokens, last
            while not queue.empty():
                body = queue.get_nowait()
                async with session.post(f"{url}/v1/chat/completions", data=body,
                                        headers=headers) as response:
                    answer = await response.json()
                    response.raise_for_status()
                answers += 1
                tokens += answer["usage"]["completion_tokens"]
                if batches is not None:
                    batches.add(body, answer)
                last = time.time()

        await asyncio.gather(*(lane(url) for url in urls for _ in range(concurrency)))
    report: dict[str, float] = {"answers": answers, "completion_tokens": tokens,
                                "last_answer_at": last, "last_at": last}
    if batches is not None:
        await batches.close()
        report.update(last_at=time.time(), objects=batches.objects, bytes=batches.bytes)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", required=True)
    parser.add_argument("--url", action="append", required=True)
    parser.add_argument("--concurrency", type=int, required=True, help="per server")
    parser.add_argument("--s3-bucket", help="upload the answers as JSONL batches here")
    parser.add_argument("--s3-endpoint-url")
    parser.add_argument("--s3-prefix", default="baseline/")
    parser.add_argument("--batch-size", type=int, default=500)
    args = parser.parse_args()
    with open(args.bodies, "rb") as fh:
        bodies = fh.read().splitlines()
    batches = (Batches(args.s3_bucket, args.s3_endpoint_url, args.s3_prefix, args.batch_size)
               if args.s3_bucket else None)
    print(json.dumps(asyncio.run(run(args.url, bodies, args.concurrency, batches))), flush=True)


if __name__ == "__main__":
    main()
