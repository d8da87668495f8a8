"""The records that pass between tokenmill's services.

JSON on the wire (msgspec), so any client can read every topic. Every record
carries a schema version `v` and the prompt's `id`.
"""

from schemas.completion import (
    Completion,
    CompletionRecord,
    Conversation,
    Failure,
    SpecStats,
    Step,
    Usage,
    decode_completion,
    encode_record,
)
from schemas.dlq import DeadLetter
from schemas.messages import FunctionCall, Message, Tool, ToolCall
from schemas.progress import ConsumerProgress, ProducerCheckpoint, SinkProgress
from schemas.prompt import PromptRecord
from schemas.run import (
    DLQ_REASONS,
    Estimate,
    GenerationSettings,
    InputFile,
    Origin,
    QAPolicy,
    RunSpec,
    S3Destination,
)
from schemas.sample import TrainingSample

SCHEMA_VERSION = 1

__all__ = [
    "SCHEMA_VERSION",
    "Completion",
    "CompletionRecord",
    "Conversation",
    "DLQ_REASONS",
    "DeadLetter",
    "Estimate",
    "Failure",
    "FunctionCall",
    "GenerationSettings",
    "InputFile",
    "Message",
    "Origin",
    "ConsumerProgress",
    "ProducerCheckpoint",
    "SinkProgress",
    "PromptRecord",
    "QAPolicy",
    "RunSpec",
    "S3Destination",
    "SpecStats",
    "Step",
    "Tool",
    "ToolCall",
    "TrainingSample",
    "Usage",
    "decode_completion",
    "encode_record",
]
