"""Failures of the producer a user can act on; each prints as one clear line
(registered with `tokenmill.commandline.register_known_error`)."""

from __future__ import annotations


class ProducerError(RuntimeError):
    """Root of the producer's user-facing errors."""


class InputError(ProducerError):
    """An input file is missing, unreadable, or not a dataset at all."""


class StrictStop(ProducerError):
    """`--strict`: the first rejected record stops the run (file, line, problem)."""


class NothingToPublish(ProducerError):
    """The inputs yielded no acceptable prompt."""


class ResumeMismatch(ProducerError):
    """The committed checkpoint does not match this publish order: resuming
    would duplicate or skip prompts, so the producer refuses."""


class AlreadyRunning(ProducerError):
    """Another producer for the same run holds the local lock."""
