"""The `tokenmill` command: parses flags, configures logging, hands off.

Subcommands are imported lazily so `tokenmill --help` stays fast and a
missing optional dependency of one service never breaks the others.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

import click

from tokenmill.malloc_arenas import limit_arenas

# name -> "module:attribute" of a click.Command
COMMANDS: dict[str, str] = {
    "dev": "devstack.command:dev",
    "runs": "ops.runs:runs",
    "sim-sglang": "sglang_sim.command:sim_sglang",
    "produce": "producer.command:produce",
    "consume": "consumer.command:consume",
    "sink": "sink.command:sink",
    "status": "ops.status:status",
    "spot-check": "ops.spot_check:spot_check",
    "dataset": "ops.dataset.command:dataset",
    "export": "ops.export.command:export",
    "report": "ops.report.command:report",
    "plan": "ops.plan.command:plan",
    "demo": "devstack.demo:demo",
    "deploy": "ops.deploy:deploy",
}


class OneLineUsageError(click.ClickException):
    """Shown as click shows any error (no usage block), with a usage error's
    exit code: click declares exit codes per class."""

    exit_code = click.UsageError.exit_code


def one_line(exc: click.UsageError) -> click.ClickException:
    """A usage error as one line, `Error: <what is wrong>`, with its exit code
    (2) and a pointer to the command's help instead of the usage block."""
    message = " ".join(exc.format_message().split())
    if exc.ctx is not None:
        message += f" (see '{exc.ctx.command_path} --help')"
    return OneLineUsageError(message)


class LazyGroup(click.Group):
    """Subcommands imported on first use; usage errors printed as one line."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise one_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise one_line(exc) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if _importable(COMMANDS[name]))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        module = importlib.import_module(module_name)
        command: click.Command = getattr(module, attr)
        return command


def _importable(target: str) -> bool:
    module_name = target.split(":")[0]
    return importlib.util.find_spec(module_name) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tokenmill")
def cli() -> None:
    """tokenmill: prompt datasets -> Kafka -> SGLang -> S3, exactly once."""


def main(argv: list[str] | None = None) -> None:
    limit_arenas()  # before any thread starts (tokenmill/malloc_arenas.py says why)
    cli.main(args=argv, prog_name="tokenmill")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
