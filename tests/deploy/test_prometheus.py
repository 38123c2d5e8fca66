"""deploy/prometheus: promtool accepts it, its rules behave, and a real Prometheus scrapes a real
run with it and evaluates every rule without error."""

from __future__ import annotations

import subprocess

import httpx
import yaml

from tests.deploy.conftest import PROM_DIR, REPO, adapt, run_healthcheck, wait_for

RULE_FILES = sorted((PROM_DIR / "rules").glob("*.yml"))


def promtool(prom_bins, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([prom_bins.promtool, *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def recording_rules() -> list[str]:
    return [rule["record"] for path in RULE_FILES
            for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"] if "record" in rule]


def test_promtool_check_config(prom_bins):
    done = promtool(prom_bins, "check", "config", str(PROM_DIR / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(RULE_FILES)} rule files found" in done.stdout + done.stderr


def test_promtool_check_rules(prom_bins):
    assert RULE_FILES, "no rule files in deploy/prometheus/rules"
    done = promtool(prom_bins, "check", "rules", *map(str, RULE_FILES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_rule_unit_tests(prom_bins):
    """Recording values and alert timing on synthetic series (tests/deploy/promtool/)."""
    done = promtool(prom_bins, "test", "rules", "tests/deploy/promtool/asteria_rules_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_rank_targets_file_is_valid_file_sd(prom_bins):
    """targets/*.yml (the other ranks of a data-parallel run) parse as file_sd target groups."""
    for path in (PROM_DIR / "targets").glob("*.yml"):
        groups = yaml.safe_load(path.read_text())
        assert isinstance(groups, list), f"{path}: file_sd wants a list of target groups"
        for g in groups:
            assert set(g) <= {"targets", "labels"} and g["targets"], f"{path}: {g}"
            assert "rank" in g.get("labels", {}), f"{path}: each rank's group needs its rank"


def test_prometheus_scrapes_the_trainer(prometheus, trainer):
    def target_up():
        targets = httpx.get(f"{prometheus.url}/api/v1/targets", timeout=5).json()
        return [t for t in targets["data"]["activeTargets"]
                if t["labels"]["job"] == "asteria" and t["health"] == "up"]

    up = wait_for(target_up, 60, "the trainer target to be up in Prometheus")
    assert up[0]["labels"]["rank"] == "0"
    assert up[0]["scrapeUrl"] == f"{trainer.url}/metrics"
    steps = wait_for(lambda: prometheus.query("asteria_steps_total"), 60,
                     "asteria_steps_total in Prometheus")
    assert float(steps[0]["value"][1]) > 0


def test_every_rule_evaluates_and_records(prometheus):
    """Every rule group ran without error, and every recording rule produced a series."""
    wait_for(lambda: prometheus.query("asteria_steps_total"), 60, "the first scrape")

    def all_evaluated():
        groups = httpx.get(f"{prometheus.url}/api/v1/rules", timeout=5).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r["health"] != "unknown" for r in rules) else None

    rules = wait_for(all_evaluated, 60, "every rule to be evaluated once")
    broken = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not broken, f"rules that failed to evaluate: {broken}"
    names = {r["name"] for r in rules}
    assert set(recording_rules()) <= names
    for record in recording_rules():
        series = wait_for(lambda rec=record: prometheus.query(rec), 60, f"{record} to record")
        assert all(s["value"][1] not in ("NaN", "+Inf", "-Inf") for s in series), series


def test_prometheus_command_answers_its_healthcheck(prometheus):
    """The compose healthcheck (wget on /-/ready) against the running Prometheus."""
    port = prometheus.url.rsplit(":", 1)[1]
    run_healthcheck(adapt("prometheus", {"9090": port}), timeout=30)
