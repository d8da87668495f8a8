"""Containers and framing: JSONL, JSON arrays, gzip, zstd, Parquet, streamed."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest
import zstandard

from producer import readers
from producer.errors import InputError
from producer.inputs import display_names, resolve
from producer.readers import InputReader, ReadProblem, split_json_array, split_lines

RECORDS = [{"prompt": f"p{i}", "note": "a ] } \" [ {"} for i in range(50)]
JSONL = b"".join(json.dumps(r).encode() + b"\n" for r in RECORDS)


def read(path: Path) -> list:
    return list(InputReader(path))


def as_dicts(items: list) -> list:
    return [json.loads(data) for _, data in items]


@pytest.mark.parametrize("name,data", [
    ("plain.jsonl", JSONL),
    ("crlf.jsonl", JSONL.replace(b"\n", b"\r\n")),
    ("bom.jsonl", b"\xef\xbb\xbf" + JSONL),
    ("data.gz", gzip.compress(JSONL)),
    ("data.zst", zstandard.ZstdCompressor().compress(JSONL)),
    ("array.json", json.dumps(RECORDS, indent=2).encode()),
    ("array.json.gz", gzip.compress(json.dumps(RECORDS).encode())),
    ("no-extension", JSONL),
])
def test_containers_are_recognized_by_content(tmp_path: Path, name: str, data: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    assert as_dicts(read(path)) == RECORDS


def test_line_numbers_count_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "gaps.jsonl"
    path.write_bytes(b'{"prompt":"a"}\n\n   \n{"prompt":"b"}\n')
    assert [line for line, _ in read(path)] == [1, 4]


def test_zstd_multi_frame(tmp_path: Path) -> None:
    compressor = zstandard.ZstdCompressor()
    path = tmp_path / "frames.zst"
    path.write_bytes(compressor.compress(JSONL[:300]) + compressor.compress(JSONL[300:]))
    assert as_dicts(read(path)) == RECORDS


def test_parquet_rows_in_row_groups(tmp_path: Path) -> None:
    import pyarrow as pa  # in the dev extra: Parquet support is tested, never skipped
    import pyarrow.parquet as pq

    rows = [{"conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(5000)]
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1000)
    got = read(path)
    assert [line for line, _ in got] == list(range(1, 5001))
    assert got[4999][1] == rows[4999]


def test_json_array_is_split_without_loading_it_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "CHUNK", 7)  # every element straddles reads
    data = json.dumps(RECORDS).encode()
    items = list(split_json_array(io.BufferedReader(io.BytesIO(data), 8)))
    assert as_dicts(items) == RECORDS
    assert [i for i, _ in items] == list(range(1, 51))


def test_json_array_problems_keep_the_neighbours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "CHUNK", 5)
    big = '{"prompt": "' + "x" * 300 + '"}'
    data = f'[{{"prompt": "a"}}, {{"bad": tru}}, {big}, "text", {{"prompt": "z"}}, {{"cut'.encode()
    items = list(split_json_array(io.BufferedReader(io.BytesIO(data), 8), limit=100))
    assert items[0] == (1, b'{"prompt": "a"}')
    assert items[1] == (2, b'{"bad": tru}')  # cut out; the JSON decoder rejects it
    assert items[2] == (3, ReadProblem("too-large", "record larger than 100 bytes"))
    assert items[3] == (4, b'"text"')
    assert items[4] == (5, b'{"prompt": "z"}')
    assert items[5] == (6, ReadProblem("truncated", "JSON array ends inside this element"))


def test_over_long_line_is_a_problem_and_skipped_without_holding_it() -> None:
    data = b'{"prompt":"a"}\n' + b"y" * 1000 + b'\n{"prompt":"b"}\n'
    items = list(split_lines(io.BufferedReader(io.BytesIO(data), 16), limit=100))
    assert items == [(1, b'{"prompt":"a"}\n'),
                     (2, ReadProblem("too-large", "line longer than 100 bytes")),
                     (3, b'{"prompt":"b"}\n')]


def test_empty_files_yield_nothing(tmp_path: Path) -> None:
    for name, data in (("empty.jsonl", b""), ("blank.jsonl", b"\n \n"), ("empty.json", b"[]"),
                       ("empty.gz", gzip.compress(b""))):
        path = tmp_path / name
        path.write_bytes(data)
        assert read(path) == []


def test_file_level_problems_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found: .*missing.jsonl"):
        resolve([tmp_path / "missing.jsonl"])
    with pytest.raises(InputError, match="not a regular file"):
        resolve([tmp_path])
    corrupt = tmp_path / "corrupt.gz"
    corrupt.write_bytes(gzip.compress(JSONL)[:-30] + b"garbage" * 5)
    with pytest.raises(InputError, match="corrupt.gz"):
        read(corrupt)
    same = tmp_path / "a.jsonl"
    same.write_bytes(JSONL)
    with pytest.raises(InputError, match="given twice"):
        resolve([same, tmp_path / "." / "a.jsonl"])


def test_display_names_grow_only_where_they_clash() -> None:
    assert display_names([Path("/d/a/train.jsonl"), Path("/d/b/train.jsonl"), Path("/d/c.jsonl")]) \
        == ["a/train.jsonl", "b/train.jsonl", "c.jsonl"]
