"""deploy/monitoring: the Prometheus alert rules pass `promtool check rules` and their unit tests
(rules.test.yml: synthetic series, each alert fires where it should and stays quiet where it should
not), the Grafana dashboard is well-formed and its queries are valid PromQL that compute what their
titles say, and every metric name in either is one of the names evalq exports (issue 23's list).

promtool comes from Debian's `prometheus` package (.ci/run installs it); without it the promtool tests
are skipped with the reason. No cluster is needed."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
RULES = MONITORING / "rules.yml"
RULE_TESTS = MONITORING / "rules.test.yml"
DASHBOARD = MONITORING / "dashboard.json"

# The names fixed in issue 23 for everyone (README, Prometheus metrics), written out here so that a
# rule or a panel using a name nobody exports fails.
METRIC_NAMES = {
    "evalq_items_scored_total", "evalq_item_errors_total", "evalq_items_skipped_total",
    "evalq_judge_calls_total", "evalq_judge_tokens_total", "evalq_judge_rate_limited_total",
    "evalq_judge_cache_hits_total", "evalq_judge_cost_total", "evalq_budget_tokens_admitted_total",
    "evalq_budget_tpm", "evalq_budget_rpm", "evalq_jobs", "evalq_jobs_stalled", "evalq_queue_backlog",
    "evalq_suite_value", "evalq_suite_regressions", "evalq_suite_last_run_timestamp_seconds",
    "evalq_suite_cost",
}
# Grafana's variables, replaced by values a query could get, so that promtool can parse the queries
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1d", "$deployment": ".*", "$suite": ".*"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found (Debian package prometheus; .ci/run installs it)")
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120)


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bevalq_\w+", expr))


def rule_groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"]


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for g in rule_groups() for r in g["rules"] if "alert" in r}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(panels: list[dict]) -> list[dict]:
    """Panels with those nested in collapsed rows."""
    return [q for p in panels for q in [p, *all_panels(p.get("panels", []))]]


def dashboard_queries(board: dict) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets, annotations, variables."""
    exprs = [t["expr"] for p in all_panels(board["panels"]) for t in p.get("targets", [])]
    exprs += [a["expr"] for a in board["annotations"]["list"] if "expr" in a]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"] if isinstance(var["query"], dict) else var["query"])
    return exprs


def grafana_free(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr  # a variable the test does not know
    return expr


# --- the alert rules ---

def test_the_rule_file_passes_promtool_check_rules():
    out = run_promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in out.stdout


def test_the_rules_unit_tests_pass():
    out = run_promtool("test", "rules", str(RULE_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_rules_unit_tests_catch_a_changed_threshold(tmp_path):
    """The unit tests can fail: with the 429 alert's threshold raised from 10% to 50%, the case where
    33% of swedencentral's calls get 429 no longer fires, and promtool says so."""
    groups = copy.deepcopy(rule_groups())
    rule = next(r for g in groups for r in g["rules"] if r.get("alert") == "EvalqJudgeRateLimited")
    assert rule["expr"].rstrip().endswith("> 0.10")
    rule["expr"] = rule["expr"].rstrip()[: -len("0.10")] + "0.50"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    shutil.copy(RULE_TESTS, tmp_path / "rules.test.yml")
    out = run_promtool("test", "rules", str(tmp_path / "rules.test.yml"))
    assert out.returncode != 0
    assert "alertname: EvalqJudgeRateLimited" in out.stdout + out.stderr
    assert "alertname: EvalqJobsStalled" not in out.stdout + out.stderr  # only the changed rule fails


def test_every_alert_fires_in_a_unit_test_and_stays_quiet_in_another():
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    fired = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert fired == set(alerts()), set(alerts()) ^ fired
    assert quiet == set(alerts()), set(alerts()) ^ quiet


def test_the_alerts_the_issue_asks_for_exist_with_a_severity_and_a_summary():
    rules = alerts()
    wanted = {
        "EvalqJudgeRateLimited": {"evalq_judge_rate_limited_total"},
        "EvalqBudgetSaturated": {"evalq_budget_tokens_admitted_total", "evalq_budget_tpm"},
        "EvalqJobsStalled": {"evalq_jobs_stalled"},
        "EvalqSuiteRegressed": {"evalq_suite_regressions"},
        "EvalqCostHigh": {"evalq_judge_cost_total"},
    }
    for name, used in wanted.items():
        assert used <= metric_names(rules[name]["expr"]), name
    assert re.search(r"\bup\{", rules["EvalqMetricsTargetDown"]["expr"])  # a scrape target down
    assert re.search(r"evalq_jobs_stalled\)\s*>\s*0$", rules["EvalqJobsStalled"]["expr"].strip())
    assert rules["EvalqJobsStalled"]["for"] == "15m"
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_rules_and_dashboard_use_only_the_names_evalq_exports():
    assert metric_names("rate(evalq_items_scored[5m]) / evalq_jobs") == {"evalq_items_scored", "evalq_jobs"}
    used = {}
    for name, rule in alerts().items():
        used[f"rule {name}"] = metric_names(rule["expr"])
    for i, expr in enumerate(dashboard_queries(dashboard())):
        used[f"dashboard query {i}: {expr}"] = metric_names(expr)
    unknown = {where: names - METRIC_NAMES for where, names in used.items() if names - METRIC_NAMES}
    assert not unknown
    # a query with no evalq name is the scrape health of evalq's targets, Prometheus's own `up`
    nameless = [where for where, names in used.items() if not names]
    assert nameless == ["rule EvalqMetricsTargetDown"]
    assert re.fullmatch(r"(up\{[^}]*\} == 0)( or up\{[^}]*\} == 0)*", alerts()["EvalqMetricsTargetDown"]["expr"].strip())
    # the dashboard shows what the issue lists
    shown = set().union(*(metric_names(e) for e in dashboard_queries(dashboard())))
    assert METRIC_NAMES - shown == set()


# --- the dashboard ---

def test_the_dashboard_is_grafana_json_with_unique_ids_and_a_datasource_variable():
    board = dashboard()
    assert board["title"] and re.fullmatch(r"[A-Za-z0-9_-]{1,40}", board["uid"])
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = all_panels(board["panels"])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    taken = set()
    for p in panels:
        box = p["gridPos"]
        assert box["w"] >= 1 and box["h"] >= 1 and 0 <= box["x"] and box["x"] + box["w"] <= 24, p["title"]
        cells = {(x, y) for x in range(box["x"], box["x"] + box["w"]) for y in range(box["y"], box["y"] + box["h"])}
        assert not cells & taken, f"{p['title']} overlaps another panel"
        taken |= cells
        if p["type"] == "row":
            continue
        assert p["type"] in ("timeseries", "stat", "bargauge", "table", "gauge"), p["type"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), p["title"]
        assert all(t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]
    for expr in dashboard_queries(board):  # every variable a query uses is defined
        for var in re.findall(r"\$(\w+)", expr):
            assert var.startswith("__") or var in variables, (var, expr)


def test_the_dashboard_queries_are_valid_promql(tmp_path):
    exprs = dashboard_queries(dashboard())
    queries = [e for e in exprs if not e.startswith("label_values(")]  # Grafana's own function
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:query_{i}", "expr": grafana_free(e)}
                                                         for i, e in enumerate(queries)]}]}
    (tmp_path / "dashboard.rules.yml").write_text(yaml.safe_dump(rules))
    out = run_promtool("check", "rules", str(tmp_path / "dashboard.rules.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    for query in (e for e in exprs if e.startswith("label_values(")):
        name, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", query).groups()
        assert name in METRIC_NAMES


def panel_query(title_start: str) -> str:
    (panel,) = [p for p in all_panels(dashboard()["panels"]) if p["title"].startswith(title_start)]
    (target,) = panel["targets"]
    return grafana_free(target["expr"])


def test_the_utilisation_and_cost_panels_compute_what_they_say(tmp_path):
    """Evaluated by promtool on synthetic series: two judge workers each admit 24,000 tokens a minute
    against a 50,000 TPM (utilisation 0.96, the brief's rate(admitted[5m]) * 60 / tpm), and the judge
    cost grows 0.5 a minute on swedencentral and 0.25 on eastus2 (30 and 15 per hour)."""
    (tmp_path / "empty.rules.yml").write_text("groups: []\n")
    test = {
        "rule_files": ["empty.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'evalq_budget_tokens_admitted_total{deployment="swedencentral",instance="w1"}', "values": "0+24000x30"},
                {"series": 'evalq_budget_tokens_admitted_total{deployment="swedencentral",instance="w2"}', "values": "0+24000x30"},
                {"series": 'evalq_budget_tpm{deployment="swedencentral",instance="w1"}', "values": "50000x30"},
                {"series": 'evalq_budget_tpm{deployment="swedencentral",instance="w2"}', "values": "50000x30"},
                {"series": 'evalq_judge_cost_total{deployment="swedencentral",instance="w1"}', "values": "0+0.5x30"},
                {"series": 'evalq_judge_cost_total{deployment="eastus2",instance="w1"}', "values": "0+0.25x30"},
            ],
            "promql_expr_test": [
                {"expr": panel_query("Token budget utilisation"), "eval_time": "20m",
                 "exp_samples": [{"labels": '{deployment="swedencentral"}', "value": 0.96}]},
                {"expr": panel_query("Judge cost per hour"), "eval_time": "20m",
                 "exp_samples": [{"labels": '{deployment="swedencentral"}', "value": 30},
                                 {"labels": '{deployment="eastus2"}', "value": 15}]},
            ],
        }],
    }
    (tmp_path / "panels.test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    out = run_promtool("test", "rules", str(tmp_path / "panels.test.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
