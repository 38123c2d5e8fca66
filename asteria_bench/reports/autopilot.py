"""The autopilot suite's words: per scenario, each configuration's time to the target loss, the
changes the autopilot made and its goal judged; the headline, how many scenarios meet it."""

from __future__ import annotations

from typing import Any

from asteria_bench.results import Words
from asteria_bench.suites.autopilot import Goal, best_static, goal


def render(data: dict[str, Any], words: Words) -> None:
    quality = data["config"]["quality"]
    for sc in data["runs"]:
        _scenario(words, sc, quality)
    _quote(words, data["runs"])


def _scenario(words: Words, sc: dict[str, Any], quality: float) -> None:
    runs = sc["runs"]
    start, pilot, best = runs[0], runs[1], best_static(runs)
    emulated = f", refreshes emulated {sc['slower']:g}x slower" if sc["slower"] != 1 else ""
    table = words.table(
        f"Scenario {sc['name']}: time to loss {sc['target_loss']:.3f} (best final + "
        f"{quality}; {sc['steps']} steps, {runs[0]['params'] / 1e6:.1f}M parameters"
        f"{emulated})",
        ["configuration", "s to target", "x best static", "final loss", "refresh wait s",
         "transfer wait s", "sync wait s", "p50 ms", "changes"])
    for r in runs:
        t = r["to_target_s"]
        table.add(r["label"], "never" if t is None else f"{t:.1f}",
                  "-" if t is None or not best["to_target_s"] else
                  f"{t / best['to_target_s']:.2f}", f"{r['final_turn_loss']:.4f}",
                  f"{r['idle_s'].get('refresh_wait', 0.0):.1f}",
                  f"{r['idle_s'].get('transfer_wait', 0.0):.1f}",
                  f"{r['idle_s'].get('sync_wait', 0.0):.1f}", f"{r['p50_ms']:.0f}",
                  len(r.get("policy_changes", [])))
    key = sc["name"].split(":")[0]
    changes = pilot.get("policy_changes", [])
    words.findings.append(
        f"Scenario {key}: the autopilot made {len(changes)} change(s)" + (": " + "; ".join(
            f"v{c['version']} from step {c['effective_step']}: {c['reason']}" for c in changes)
            if changes else " (nothing it reads was amiss)."))
    words.findings.append(f"Scenario {key}: {_verdict(goal(start, pilot, best), best, quality)}")


def _verdict(judged: Goal, best: dict[str, Any], quality: float) -> str:
    if not judged.reached:
        return (f"the autopilot misses the goal: it never reached the target (final loss "
                f"{judged.gap:+.4f} against {best['label']}).")
    against = "never reached the target" if judged.speedup is None else \
        f"{judged.speedup:.2f}x"
    return (f"the autopilot {'meets' if judged.met else 'misses'} the goal: {judged.ratio:.2f}x "
            f"the best static policy's time ({best['label']}; goal 1.05x), final loss "
            f"{judged.gap:+.4f} against it (goal within {quality}); against its starting policy "
            f"{against} ({'poor' if judged.poor else 'not poor'}: goal 1.25x where poor).")


def _quote(words: Words, scenarios: list[dict[str, Any]]) -> None:
    """Headline figures (numbers): how many scenarios meet the goal, and the autopilot's worst
    time against the best static policy's; every scenario's figures in the sentence."""
    each = "; ".join(f"{sc['name'].split(':')[0]}: "
                     + ("never reached" if sc["vs_best"] is None else f"{sc['vs_best']:.2f}x")
                     for sc in scenarios)
    words.quote("autopilot_goals_met", sum(sc["met"] for sc in scenarios),
                f"the autopilot meets its goal in {{value}} of {len(scenarios)} "
                f"scenarios (time to the loss over the best static policy's: {each})")
    reached = [sc["vs_best"] for sc in scenarios if sc["vs_best"] is not None]
    if reached:
        words.quote("autopilot_worst_vs_best", max(reached),
                    "the autopilot's time to the loss is at most {value:.2f}x the best static "
                    "policy's in the scenarios where it reaches the loss (goal: 1.05x)")
