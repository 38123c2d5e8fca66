"""The tiers suite's words: peak memory and step time per budget against all in memory, and
the disk tier's bandwidth against dd's on the same disk."""

from __future__ import annotations

from typing import Any

from asteria_bench.results import Words
from asteria_bench.suites.tiers import by_placement, figures, med


def render(data: dict[str, Any], words: Words) -> None:
    config = data["config"]
    runs = by_placement(data["runs"])
    dds = [r for r in data["runs"] if r["kind"] == "dd"]
    found = figures(runs)
    rss, share, step, step_ratio = found.rss, found.share, found.step, found.step_ratio
    mib = 2**20
    state_bytes = config["state_bytes"]
    cuda = config["device"] == "cuda"
    columns = ["placement", "in memory (device / host MiB)", "on disk MiB", "peak RSS MiB",
               "state share of RSS MiB", "share / all in memory", "step s (median)",
               "step / all in memory", "prefetch hit ratio"]
    if cuda:
        columns.insert(4, "device peak MiB")
    t = words.table(f"Peak memory and step time per budget (SOAP state "
                    f"{state_bytes / mib:.0f} MiB, {config['layers']} layers "
                    f"{config['rows']}x{config['cols']}; medians of {config['repeats']} "
                    "repeats)", columns,
                    note="state share = the placement's peak RSS - the base process's "
                         "(forward and backward only)")
    for name, rs in runs.items():
        first = rs[0]
        tiers = first.get("tier_bytes") or {"device": state_bytes if name == "memory" else 0,
                                            "host": 0, "disk": 0}
        hit = med(r["prefetch_hit_ratio"] for r in rs) if first.get("tier_bytes") else None
        row = [name, f"{tiers['device'] / mib:.0f} / {tiers['host'] / mib:.0f}",
               round(tiers["disk"] / mib, 1), round(rss[name] / mib, 1),
               round(share[name] / mib, 1) if name in share else None,
               round(share[name] / share["memory"], 3) if name in share else None,
               round(step[name], 4), round(step_ratio[name], 3) if name in step_ratio else None,
               round(hit, 4) if hit is not None else None]
        if cuda:
            row.insert(4, round(med(r["device_peak_bytes"] for r in rs) / mib, 1))
        t.add(*row)

    # Disk bandwidth of the original tiered budget (25% in memory), against dd.
    tiered = runs["tiered 25%"]
    bw = {direction: _bandwidth(tiered, dds, direction) for direction in ("read", "write")}
    dd_read, dd_write = bw["read"]["dd"], bw["write"]["dd"]
    b = words.table(
        "Disk tier bandwidth against dd (O_DIRECT, same disk, same run; budget 25%)",
        ["direction", "dd MB/s", "tier during training MB/s", "/ dd", "tier alone MB/s",
         "/ dd", "dd on the same files MB/s", "tier alone / dd, same files"],
        note=f"dd file {config['dd_mib']} MiB; O_DIRECT {tiered[0]['o_direct']}; during training "
             "the prefetch reads and the write-backs overlap and share the disk")
    for direction, v in bw.items():
        b.add(direction, round(v["dd"] / 1e6, 1), round(v["training"] / 1e6, 1),
              round(v["training"] / v["dd"], 3), round(v["alone"] / 1e6, 1),
              round(v["alone"] / v["dd"], 3), round(v["same_dd"] / 1e6, 1),
              round(v["same_ratio"], 3))

    ratio = share["tiered 25%"] / share["memory"]
    words.quote("state_rss_ratio", round(ratio, 3),
                "tiered SOAP (25% of its state in memory, the rest on disk) keeps "
                "{value:.2f}x of all-in-memory SOAP's optimizer-state RSS")
    words.quote("step_time_ratio", round(step_ratio["tiered 25%"], 3),
                "at {value:.2f}x all-in-memory SOAP's step time")
    words.quote("read_bandwidth_ratio", round(bw["read"]["same_ratio"], 3),
                "the disk tier reads at {value:.2f}x dd's bandwidth on the same files")
    for name in share:
        if name == "memory":
            continue
        words.findings.append(
            f"With {name.split()[-1]} of the SOAP state in memory (device + host budgets, the rest "
            f"on disk), the optimizer-state share of peak RSS is "
            f"{share[name] / mib:.0f} MiB against {share['memory'] / mib:.0f} MiB all in memory "
            f"({share[name] / share['memory']:.2f}x), at {step_ratio[name]:.2f}x the step time "
            f"(median over {config['repeats']} interleaved repeats).")
    words.findings.append(
        f"During training the disk tier read at {bw['read']['training'] / 1e6:.0f} MB/s and "
        f"wrote at {bw['write']['training'] / 1e6:.0f} MB/s, {bw['read']['training'] / dd_read:.2f}"
        f"x and {bw['write']['training'] / dd_write:.2f}x dd's "
        f"{dd_read / 1e6:.0f} / {dd_write / 1e6:.0f} MB/s on the same disk; alone, on the very "
        f"files dd then read and wrote, it reached {bw['read']['same_ratio']:.2f}x (read) and "
        f"{bw['write']['same_ratio']:.2f}x (write) of dd.")
    lo, hi = min(d["read_bytes_per_second"] for d in dds), max(d["read_bytes_per_second"]
                                                               for d in dds)
    if len(dds) > 1:
        words.findings.append(
            f"dd's own read of its {config['dd_mib']} MiB file ranged {lo / 1e6:.0f} to "
            f"{hi / 1e6:.0f} MB/s between repeats, hence the same-files comparison.")


def _bandwidth(tiered: list[dict[str, Any]], dds: list[dict[str, Any]],
               direction: str) -> dict[str, float]:
    """The disk tier's bandwidth in one direction (bytes/s, medians over repeats): during
    training, alone, dd's on the same files, the tier alone over that, and dd's own."""
    return {
        "training": med(r[f"disk_{direction}_bytes"] / r[f"disk_{direction}_seconds"]
                        for r in tiered),
        "alone": med(r[f"isolated_{direction}_bytes_per_second"] for r in tiered),
        "same_dd": med(r[f"same_files_dd_{direction}_bytes_per_second"] for r in tiered),
        "same_ratio": med(r[f"isolated_{direction}_bytes_per_second"]
                          / r[f"same_files_dd_{direction}_bytes_per_second"] for r in tiered),
        "dd": med(d[f"{direction}_bytes_per_second"] for d in dds)}
