"""How far a consumer is behind a partition's end, from the high watermark
its last fetch brought back (cached by librdkafka: no broker call, so a lag
gauge can be updated on every commit). Approximate: transaction markers
take offsets too. Workers measure from their committed offset, sinks from
their position.
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import Consumer, TopicPartition


def behind(consumer: Consumer, topic: str, partition: int, offset: int) -> int | None:
    """Records from `offset` to the partition's cached high watermark; None
    until the consumer has fetched from the partition. Raises what the
    client raises for a partition it does not know."""
    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
    if high is None or high < 0:
        return None
    return max(0, high - offset)


def position_lags(consumer: Consumer, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    """Each partition's records from the consumer's position to its cached
    high watermark, for those where both are known. Raises what the client
    raises."""
    positions = consumer.position([TopicPartition(topic, p) for p in partitions])
    lags: dict[int, int] = {}
    for tp in positions:
        if tp.offset < 0:
            continue
        lag = behind(consumer, tp.topic, tp.partition, tp.offset)
        if lag is not None:
            lags[tp.partition] = lag
    return lags
