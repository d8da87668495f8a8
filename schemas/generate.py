"""Write the JSON Schema files for every record, from the Structs.

    python -m schemas.generate          # rewrite schemas/jsonschema/
    python -m schemas.generate --check  # exit 1 if any file is stale
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from schemas.completion import CompletionRecord
from schemas.dlq import DeadLetter
from schemas.plan import Plan
from schemas.progress import Progress
from schemas.prompt import PromptRecord
from schemas.run import RunSpec
from schemas.sample import ConversationSample, TrainingSample
from schemas.turn import TurnRecord

SCHEMA_DIR = Path(__file__).parent / "jsonschema"

RECORDS: dict[str, Any] = {
    "run-spec": RunSpec,
    "prompt": PromptRecord,
    "completion": CompletionRecord,
    "dead-letter": DeadLetter,
    "training-sample": TrainingSample,
    "conversation-sample": ConversationSample,
    "turn": TurnRecord,
    "progress": Progress,
    "plan": Plan,
}


def render(record_type: Any) -> str:
    schema = msgspec.json.schema(record_type)
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def stale_files() -> list[str]:
    stale = []
    for name, record_type in RECORDS.items():
        path = SCHEMA_DIR / f"{name}.schema.json"
        if not path.is_file() or path.read_text() != render(record_type):
            stale.append(str(path))
    return stale


def write_all() -> None:
    SCHEMA_DIR.mkdir(exist_ok=True)
    for name, record_type in RECORDS.items():
        (SCHEMA_DIR / f"{name}.schema.json").write_text(render(record_type))


if __name__ == "__main__":
    if "--check" in sys.argv:
        stale = stale_files()
        if stale:
            print("stale JSON Schema files (run `python -m schemas.generate`):", *stale, sep="\n  ")
            sys.exit(1)
    else:
        write_all()
