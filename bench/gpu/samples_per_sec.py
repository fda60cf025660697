"""Median steady-state samples/s from a log: trainctl's JSON follow output
(MetricPoint samples_per_sec, summed over ranks per window) or the PyTorch
baseline's `samples_per_sec=` lines. Prints '-' when there is none."""
import json, statistics, sys

vals = []
for line in open(sys.argv[1], errors="replace"):
    line = line.strip()
    if line.startswith("samples_per_sec="):
        vals.append(float(line.split("=", 1)[1]))
        continue
    if not line.startswith("{"):
        continue
    try:
        u = json.loads(line)
    except ValueError:
        continue
    for p in u.get("metrics", {}).get("points", []):
        if p.get("kind") == "KIND_TRAIN" and p.get("samplesPerSec"):
            vals.append(float(p["samplesPerSec"]))
vals = vals[1:] if len(vals) > 2 else vals  # the first window holds the warm-up
print("%.0f" % statistics.median(vals) if vals else "-")
