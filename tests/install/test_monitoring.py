"""The shipped Prometheus rules and Grafana dashboard name only metrics the
services export and set: a renamed metric must fail here, not in a silent
alert that can never fire. No broker needed.

`promtool check rules` (Prometheus's own parser) is an opt-in check outside
this file: `make check-monitoring` (see the README's Monitoring section).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from consumer.metrics import ConsumerMetrics
from sink.metrics import SinkMetrics
from tokenmill import deploy_files

REPO = Path(__file__).resolve().parents[2]

# Words of PromQL that are not metric names when they stand outside a call.
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "bool", "offset", "inf", "nan", "atan2", "start", "end"}
# Clauses whose parenthesised list holds label names, not expressions.
LABEL_LISTS = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE)
STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
IDENTIFIER = re.compile(r"(?<![\w.$])([a-zA-Z_:][\w:]*)(\s*\()?")


def _strip_brackets(expr: str, opening: str, closing: str) -> str:
    """Drop every `opening ... closing` span (nesting-aware): label matchers
    and range or subquery selectors hold no metric names."""
    out: list[str] = []
    depth = 0
    for char in expr:
        if char == opening:
            depth += 1
        elif char == closing and depth:
            depth -= 1
        elif not depth:
            out.append(char)
    return "".join(out)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are
    neither a function or aggregation (followed by `(`), nor a keyword, nor
    inside strings, `{...}` matchers, `[...]` ranges or `by (...)` lists."""
    text = STRING.sub('""', expr)
    text = _strip_brackets(text, "{", "}")
    text = _strip_brackets(text, "[", "]")
    text = LABEL_LISTS.sub(" ", text)
    names = set()
    for match in IDENTIFIER.finditer(text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def _metric_objects(holder: object) -> dict[str, MetricWrapperBase]:
    return {attr: value for attr, value in vars(holder).items()
            if isinstance(value, MetricWrapperBase)}


def exported_samples(holder: object, registry: CollectorRegistry) -> set[str]:
    """Every sample name the metrics object exposes, as a scrape sees it:
    labelled metrics get one child each, since prometheus_client shows a
    labelled metric's samples only once a child exists."""
    for metric in _metric_objects(holder).values():
        if metric._labelnames:
            metric.labels(*["x"] * len(metric._labelnames))
    return {sample.name for family in registry.collect() for sample in family.samples}


def _family_of(sample: str, families: set[str]) -> str:
    """`x_total`, `x_bucket` ... -> `x` (the name the code gave the metric)."""
    for suffix in ("_total", "_created", "_bucket", "_sum", "_count", ""):
        base = sample.removesuffix(suffix) if suffix else sample
        if base in families:
            return base
    raise KeyError(sample)


def services() -> list[tuple[str, object, CollectorRegistry]]:
    """(source package, metrics object, its fresh registry) per service."""
    consumer = ConsumerMetrics()
    sink_registry = CollectorRegistry()
    return [("consumer", consumer, consumer.registry),
            ("sink", SinkMetrics(sink_registry), sink_registry)]


def exported() -> dict[str, tuple[str, str]]:
    """Sample name -> (source package, attribute) for every exported sample."""
    table = {}
    for package, holder, registry in services():
        by_family = {metric._name: attr for attr, metric in _metric_objects(holder).items()}
        for sample in exported_samples(holder, registry):
            table[sample] = (package, by_family[_family_of(sample, set(by_family))])
    return table


def set_attributes(package: str) -> set[str]:
    """Metric attributes the package's code touches (`metrics.<attr>`)
    outside the definitions: a metric that is declared but never set or
    incremented exports nothing worth an alert."""
    source = "\n".join(path.read_text() for path in (REPO / package).rglob("*.py")
                       if path.name != "metrics.py")
    return set(re.findall(r"\b_?metrics\.(\w+)\b", source))  # self.metrics or self._metrics


def rule_exprs(text: str) -> Iterator[tuple[str, str]]:
    for group in yaml.safe_load(text)["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]


def dashboard_exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for panel in panels:
            for target in panel.get("targets", []):
                yield panel["title"], target["expr"]
            yield from walk(panel.get("panels", []))
    yield from walk(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            label_values = re.fullmatch(r"label_values\((.*),\s*\w+\)", query["query"])
            assert label_values, variable
            yield f"variable {variable['name']}", label_values.group(1)


ALERTS = deploy_files.read_text("deploy/prometheus/alerts.yml")
DASHBOARD = json.loads(deploy_files.read_text("deploy/grafana/tokenmill.json"))
EXPORTED = exported()


def unknown_metrics(exprs: list[tuple[str, str]], known: set[str]) -> list[str]:
    return [f"{where}: {name}" for where, expr in exprs for name in sorted(metric_names(expr))
            if name not in known]


# -- the tokenizer ------------------------------------------------------------


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (job, instance) (rate(a_total{result="x", le=~"y|z"}[5m]))', {"a_total"}),
    ("histogram_quantile(0.99, sum by (le) (rate(b_bucket[$__rate_interval])))", {"b_bucket"}),
    ("x / on (job) group_left (instance) y > bool 1e-3", {"x", "y"}),
    ("changes((max by (p) (c))[30m:1m]) == 0 and d offset 5m", {"c", "d"}),
    ('absent(up{job="sink"} == 1) or vector(0)', {"up"}),
    ('label_replace(m, "dst", "$1", "src", "(.*)") unless ignoring (a) n', {"m", "n"}),
    ("sglang:num_running_reqs + Inf * NaN", {"sglang:num_running_reqs"}),
    ("sum without (instance) (e) * 2.5e+3", {"e"}),
])
def test_metric_names_skip_functions_keywords_matchers_strings_and_durations(
        expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_exported_samples_carry_prometheus_client_suffixes() -> None:
    assert {"tokenmill_consumer_transactions_total", "tokenmill_consumer_commit_seconds_bucket",
            "tokenmill_consumer_commit_seconds_count", "tokenmill_consumer_in_flight",
            "tokenmill_sink_upload_seconds_bucket", "tokenmill_sink_dlq_records_total",
            "tokenmill_sink_lag_records"} <= set(EXPORTED)
    assert "tokenmill_consumer_transactions" not in EXPORTED  # counters export `_total`


# -- the shipped files ----------------------------------------------------------


def test_every_alert_names_exported_metrics_only() -> None:
    exprs = list(rule_exprs(ALERTS))
    assert len(exprs) >= 15
    assert unknown_metrics(exprs, set(EXPORTED) | {"up"}) == []


def test_every_dashboard_query_names_exported_metrics_only() -> None:
    exprs = list(dashboard_exprs(DASHBOARD))
    assert len(exprs) >= 30
    assert unknown_metrics(exprs, set(EXPORTED) | {"up"}) == []


def test_a_misspelt_metric_in_an_alert_is_caught() -> None:
    broken = ALERTS.replace("tokenmill_sink_aborted_commits_total",
                            "tokenmill_sink_aborted_commit_total", 1)
    assert unknown_metrics(list(rule_exprs(broken)), set(EXPORTED) | {"up"}) == [
        "TokenmillSinkAbortedCommits: tokenmill_sink_aborted_commit_total"]


def test_the_monitored_metrics_are_set_by_their_service() -> None:
    named = {name for where, expr in [*rule_exprs(ALERTS), *dashboard_exprs(DASHBOARD)]
             for name in metric_names(expr) if name != "up"}
    unset = sorted(name for name in named
                   if EXPORTED[name][1] not in set_attributes(EXPORTED[name][0]))
    assert unset == []


@pytest.mark.parametrize("sample", ["tokenmill_consumer_lag", "tokenmill_consumer_waiting_results"])
def test_the_worker_sets_its_backlog_gauges(sample: str) -> None:
    # Once declared and never set (found by the check above); now the worker
    # sets them after each commit (consumer/committer.py `_observe_backlog`).
    package, attribute = EXPORTED[sample]
    assert attribute in set_attributes(package)


def test_a_declared_but_never_set_metric_is_caught() -> None:
    package, _ = EXPORTED["tokenmill_consumer_lag"]
    assert "no_such_gauge" not in set_attributes(package)


def test_alerts_carry_severity_summary_and_description_naming_their_subject() -> None:
    for group in yaml.safe_load(ALERTS)["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            annotations = rule["annotations"]
            assert annotations["summary"] and annotations["description"], rule["alert"]
            grouped = re.search(r"\bby \(([^)]*)\)", rule["expr"])
            subject = "instance"
            if rule["expr"].startswith("absent("):
                continue
            if grouped and "instance" not in grouped.group(1):
                subject = "job"
            assert f"$labels.{subject}" in annotations["summary"], rule["alert"]
            assert f"$labels.{subject}" in annotations["description"], rule["alert"]


def test_dashboard_is_a_grafana_model_over_a_prometheus_datasource_variable() -> None:
    assert DASHBOARD["schemaVersion"] == 39 and DASHBOARD["uid"] and DASHBOARD["title"]
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in DASHBOARD["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
    titles = " ".join(panel["title"] for panel in DASHBOARD["panels"]).lower()
    for wanted in ("requests/s", "output tokens/s", "in flight vs limit", "accept length",
                   "lag per partition", "failures by kind", "finish reasons", "s3 objects",
                   "s3 bytes", "records in", "dlq by reason", "upload and commit latency",
                   "breaker", "up"):
        assert wanted in titles, wanted


def test_example_prometheus_config_scrapes_the_jobs_the_alerts_name() -> None:
    config = yaml.safe_load(deploy_files.read_text("deploy/prometheus/prometheus.yml"))
    assert config["rule_files"] == ["alerts.yml"]
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert set(re.findall(r"[\w-]+", re.search(r'up\{job=~"([^"]+)"', ALERTS).group(1))) == jobs
