"""The baseline of the consumer and fleet benchmarks: the seed run's loop.

Reads request bodies (one JSON object per line, the exact bodies tokenmill
sends), posts them to one or more servers from one shared queue,
`--concurrency` requests at a time per server, and prints one JSON line:
answers, completion tokens, and the wall clock (epoch seconds) of the last
answer. No Kafka, no retries, no bookkeeping; it imports nothing from
tokenmill, so its start-up is a bare aiohttp script's.

    python bench/plain_loop.py --bodies bodies.jsonl --url http://127.0.0.1:30000 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp


async def run(urls: list[str], bodies: list[bytes], concurrency: int) -> dict[str, float]:
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
                last = time.time()

        await asyncio.gather(*(lane(url) for url in urls for _ in range(concurrency)))
    return {"answers": answers, "completion_tokens": tokens, "last_at": last}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", required=True)
    parser.add_argument("--url", action="append", required=True)
    parser.add_argument("--concurrency", type=int, required=True, help="per server")
    args = parser.parse_args()
    with open(args.bodies, "rb") as fh:
        bodies = fh.read().splitlines()
    print(json.dumps(asyncio.run(run(args.url, bodies, args.concurrency))), flush=True)


if __name__ == "__main__":
    main()
