"""The scale-memory suite's words: the memory headline (refused all in memory under the cap,
trained tiered) and the bit-for-bit match of tiered and in-memory losses."""

from __future__ import annotations

from typing import Any

from asteria_bench.results import Words
from asteria_bench.suites.scale_memory import REFUSED, GiB


def render(data: dict[str, Any], words: Words) -> None:
    config = data["config"]
    match, row = config["tiered_match"], config.get("memory_headline")
    if row is None:
        words.findings.append("The memory headline was not measured: "
                              f"{config['memory_headline_missing']}.")
    else:
        _table(words, row, match)
    _findings(words, row, match)


def _table(words: Words, row: dict[str, Any], match: dict[str, Any]) -> None:
    t = row["tiered"]
    table = words.table(
        f"Memory headline: {row['model']} ({row['params'] / 1e9:.2f}B parameters) under a "
        f"{row['cap_bytes'] / GiB:.1f} GiB memory cgroup",
        ["run", "outcome", "peak RSS GiB", "on disk GiB", "step s (median)", "compute s",
         "tier waits s", "refresh s"],
        note="memory: SOAP state all in memory, refused before step 1; tiered: device budget "
             "one working set, host budget two staging buffers, the rest on disk; refreshes "
             f"inline. Tiered and in-memory losses equal bit for bit at {match['model']}: "
             f"{match['equal']}")
    refused = row["memory"]
    table.add("all in memory", f"exit {refused['returncode']}: {refused['message']}",
              None, None, None, None, None, None)
    if t["returncode"]:
        table.add("tiered", f"exit {t['returncode']}", None, None, None, None, None, None)
        return
    per = t["seconds_per_step"]
    table.add("tiered", f"trained {t['steps']} steps", round(t["peak_rss_bytes"] / GiB, 2),
              round(t["disk_bytes"] / GiB, 2), round(t["step_seconds_median"], 2),
              round(per["compute"], 2), round(per["transfer_wait"], 2), round(per["refresh"], 2))


def _findings(words: Words, row: dict[str, Any] | None, match: dict[str, Any]) -> None:
    """The headline in words: refused in memory, trained tiered, the same losses."""
    words.quote("tiered_equals_memory", float(match["equal"]),
                f"tiered and all-in-memory SOAP give the same losses bit for bit at "
                f"{match['model']}: {{value:.0f}} (1 = yes)")
    words.findings.append(
        f"Tiered and all-in-memory SOAP at {match['model']} ({match['params'] / 1e6:.0f}M "
        f"parameters), {match['steps']} steps with the staged results swapped in, both with "
        f"{match.get('memory_threads')} threads: the losses are "
        + ("equal bit for bit." if match["equal"] else "NOT equal."))
    if row is None:
        return
    refused, tiered = row["memory"], row["tiered"]
    cap = f"{row['cap_bytes'] / GiB:.1f} GiB"
    model = f"{row['model']} ({row['params'] / 1e9:.2f}B parameters)"
    if row["trained_under_cap"]:
        words.quote("tiered_peak_rss_gib", tiered["peak_rss_bytes"] / GiB,
                    f"a {model} GPT trains with tiered SOAP state under a {cap} memory cap, "
                    "peak RSS {value:.1f} GiB, where SOAP with its state all in memory is "
                    "refused up front")
        words.quote("tiered_step_s", tiered["step_seconds_median"],
                    "its median step takes {value:.0f} s on this machine's 2 cores")
    words.findings.append(
        f"{model} under a {cap} memory cgroup: SOAP with its state all in memory "
        + (f"was refused before step 1 (exit {refused['returncode']}: {refused['message']})"
           if refused["returncode"] == REFUSED else f"ended with exit {refused['returncode']}")
        + "; with tiered state it "
        + (f"trained {tiered['steps']} steps, peak RSS {tiered['peak_rss_bytes'] / GiB:.2f} GiB "
           f"(the cgroup's peak, page cache included, {tiered['cgroup_peak_bytes'] / GiB:.2f} "
           f"GiB), {tiered['disk_bytes'] / GiB:.2f} GiB on disk, median step "
           f"{tiered['step_seconds_median']:.1f} s." if row["trained_under_cap"] else
           f"did not train its steps (exit {tiered['returncode']})."))
