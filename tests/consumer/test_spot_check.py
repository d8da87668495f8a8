import pytest
from click.testing import CliRunner

from tests.consumer.pipeline import ConsumerProcess, create_run, make_prompts, publish
from tokenmill.cli import cli
from tokenmill.simulator import SimulatorConfig, running_simulator

pytestmark = [pytest.mark.broker]


def test_spot_check_shows_committed_results_by_category(settings, run_id, tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=2)
    publish(settings, spec, make_prompts(run_id, 60, tools_every=3))
    with running_simulator(SimulatorConfig(zero_delay=True, length_median=30,
                                           tool_call_parser="qwen25")) as url:
        worker = ConsumerProcess(settings, run_id, url, "s0", tmp_path, "--until-done").start()
        try:
            assert worker.wait(120) == 0
        finally:
            worker.stop()
    result = CliRunner().invoke(cli, ["spot-check", "--run", run_id, "--category", "tools",
                                      "-n", "2", "--bootstrap-servers",
                                      settings.bootstrap_servers])
    assert result.exit_code == 0, result.output
    assert result.output.count("(tools, test.jsonl") == 2
    assert "tools offered" in result.output and "get_weather" in result.output
    assert "user → assistant (generated)" in result.output
