"""Print the performance comparison of one or more runs as a Markdown table.

    .venv/bin/python scripts/perf_table.py runs/gptq-w4a16/<id> [runs/smoothquant-gptq-w8a8/<id> ...]

Per workload point: output tokens/s and P99 TTFT of baseline and candidate (medians
over the repeats), their ratio with the range over the paired repeats, and whether the
difference is larger than the run-to-run noise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def fmt_ratio(c: dict) -> str:
    if c.get("ratio") is None:
        return "-"
    noise = "" if c.get("beyond_noise") is None else (" *" if c["beyond_noise"] else " (noise)")
    return f"{c['ratio']:.2f} [{c['ratio_min']:.2f}-{c['ratio_max']:.2f}]{noise}"


def main(paths: list[str]) -> int:
    print("| recipe | point | out tok/s base | out tok/s cand | ratio [range] | P99 TTFT ms base | P99 TTFT ms cand "
          "| ratio [range] | failed gates |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in paths:
        record = json.loads((Path(p) / "run.json").read_text())
        perf = (record["stages"].get("performance") or {}).get("result")
        if not perf:
            print(f"| {record['recipe_name']} | no performance result | | | | | | | |")
            continue
        for pt in perf["points"]:
            b, c, cmp = pt["baseline"], pt["candidate"], pt["comparison"]
            fails = [g["gate"] for g in perf["gates"] if g["verdict"] == "fail" and g["scope"].endswith(pt["point"])
                     and g["scope"].startswith(pt["workload"])]
            print(f"| {record['recipe_name']} | {pt['workload']}/{pt['point']} | {b['output_tokens_per_s']:.1f} | "
                  f"{c['output_tokens_per_s']:.1f} | {fmt_ratio(cmp['output_tokens_per_s'])} | "
                  f"{b['ttft_ms']['p99']:.0f} | {c['ttft_ms']['p99']:.0f} | {fmt_ratio(cmp['ttft_ms.p99'])} | "
                  f"{', '.join(fails) or '-'} |")
        ctx = perf["workload_context"]
        print(f"\n{record['recipe_name']}: {ctx['label']}; order {' '.join(perf['order'])}; "
              f"client CPU {perf['client_cpu_share']:.2f} s/s; client ceiling "
              f"{(perf['client'] or {}).get('requests_per_s', 0):.0f} req/s")
    print("\n* = the difference is larger than the run-to-run spread of either model; (noise) = it is not")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
