#!/usr/bin/env python3
"""Formats trainctl-bench-coordinator results (key=value lines) as a table,
prints it, and writes the "## Coordinator at scale" section of RESULTS.md.

    report.py RESULTS_TXT RESULTS_MD [WRITE(1|0)]
"""
import os
import re
import subprocess
import sys

SECTION = "## Coordinator at scale"
STORE_SECTION = "## Store backends: SQLite and PostgreSQL"


def load(path):
    r = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if "=" in line:
                k, v = line.split("=", 1)
                r[k] = v
    return r


def num(r, k):
    try:
        return float(r[k])
    except (KeyError, ValueError):
        return None


def rtt_goal_ms(workers):
    """Issue #49's heartbeat round-trip goal: p99 < 50 ms at 10,000 workers, < 200 ms at 50,000."""
    return 50.0 if workers is None or workers <= 10000 else 200.0


def interval_text(r, p):
    """The heartbeat interval the simulated workers kept to at the end of the steady window
    (the coordinator lengthens it past --max-heartbeats-per-sec), and how many acks changed it."""
    lo, hi = num(r, f"{p}.heartbeat_interval_min_ms"), num(r, f"{p}.heartbeat_interval_max_ms")
    if lo is None or hi is None:
        return "n/a"
    span = fmt(lo, " ms", 0) if lo == hi else f"{fmt(lo, '', 0)}–{fmt(hi, ' ms', 0)}"
    return f"{span} ({fmt(num(r, f'{p}.heartbeat_terms_changed'), digits=0)} acks changed it)"


def fmt(v, unit="", digits=1):
    if v is None:
        return "n/a"
    if abs(v) >= 100 or digits == 0:
        s = f"{v:,.0f}"
    else:
        s = f"{v:.{digits}f}"
    return s + unit


def verdict(ok):
    if ok is None:
        return "n/a"
    return "PASS" if ok else "FAIL"


def strict(ms):
    """Failure detection against the 3 s goal: PASS, or FAIL with the excess."""
    if ms is None or ms < 0:
        return "n/a"
    return "PASS" if ms <= 3000 else f"FAIL (+{ms - 3000:,.0f} ms)"


def write_telemetry_series(r, plots_dir):
    """bench/plots/telemetry.dat from the run's tel.series.N rows (second N of
    the steady window: coordinator cores, heartbeat RTT p99 ms, ingest p99 ms,
    write syscalls/s). False when the run has none."""
    rows = sorted((int(k.rsplit(".", 1)[1]), v) for k, v in r.items() if k.startswith("tel.series."))
    if not rows:
        return False
    os.makedirs(plots_dir, exist_ok=True)
    with open(os.path.join(plots_dir, "telemetry.dat"), "w") as f:
        f.write(f"# bench/coordinator/run.sh {r.get('meta.date', '?')} (commit {r.get('meta.commit', '?')}): "
                "second, coordinator cores, heartbeat RTT p99 ms, ingest p99 ms, write syscalls/s\n")
        for sec, v in rows:
            f.write(f"{sec} {v}\n")
    return True


def loop_rows(r, p, row, scn):
    """The coordinator loop's histograms over the steady window (loop.<kind>.<wait|run>.*)."""
    if num(r, f"{p}.loop.posted.wait.n") is None:
        return

    def q(kind, what):
        g = lambda k: num(r, f"{p}.loop.{kind}.{what}.{k}")
        cell = lambda v: "n/a" if v is None else ("> last bucket" if v < 0 else fmt(v, " ms", 2))
        return (f"{cell(g('p50_ms'))} / {cell(g('p99_ms'))} / {cell(g('p999_ms'))} "
                f"(n={fmt(g('n'), digits=0)})")
    row(scn, "coordinator loop, task wait p50 / p99 / p99.9 (bucket bounds): posted; timers",
        f"{q('posted', 'wait')}; {q('timer', 'wait')}")
    row(scn, "coordinator loop, task run p50 / p99 / p99.9 (bucket bounds): posted; timers",
        f"{q('posted', 'run')}; {q('timer', 'run')}")


def telemetry_rows(r, p, row, store=""):
    """The telemetry scenario's rows for result prefix `p` (tel, telpg);
    `store` names the store in the scenario label ("" for the main table)."""
    if num(r, f"{p}.jobs") is None:
        return False
    g = lambda k: num(r, f"{p}.{k}")
    cpu, p99, ing = g("coord_cpu_cores"), g("rtt.p99_ms"), g("ingest.p99_ms")
    scn = (f"telemetry, {fmt(g('ranks'), digits=0)} ranks ({fmt(g('jobs'), digits=0)} jobs × "
           f"{fmt(g('ranks_per_job'), digits=0)}) + {fmt(g('idle_workers'), digits=0)} workers"
           + (f", {store}" if store else ""))
    row(scn, "jobs running / workers registered",
        f"{fmt(g('jobs_running'), digits=0)} / {fmt(g('workers_registered'), digits=0)}")
    row(scn, "coordinator CPU (steady window)", fmt(cpu, " cores", 3), "< 1 core",
        (cpu < 1.0) if cpu is not None else None)
    if g("store_cpu_cores") is not None:
        row(scn, "store server CPU (PostgreSQL: postmaster and its processes, steady window)",
            fmt(g("store_cpu_cores"), " cores", 3))
    row(scn, "coordinator busiest threads (cores); avg threads waiting for a CPU",
        f"{r.get(f'{p}.coord.top_threads_cores', 'n/a')}; {fmt(g('coord.runqueue_wait_threads'), '', 2)}")
    loop_rows(r, p, row, scn)
    row(scn, "heartbeat round trip p50 / p99",
        f"{fmt(g('rtt.p50_ms'), ' ms', 2)} / {fmt(p99, ' ms', 2)}", "p99 < 50 ms",
        (p99 < 50) if p99 is not None else None)
    row(scn, "metric ingest, rank sends → watcher reads: p50 / p99 / max",
        f"{fmt(g('ingest.p50_ms'), ' ms', 1)} / {fmt(ing, ' ms', 1)} / "
        f"{fmt(g('ingest.max_ms'), ' ms', 1)} ({fmt(g('ingest.n'), digits=0)} points)",
        "p99 < 200 ms", (ing < 200) if ing is not None else None)
    row(scn, "coordinator write syscalls/s (≥ database commits/s with SQLite) and MB/s written",
        f"{fmt(g('coord_write_syscalls_per_s'), '/s', 0)}; {fmt(g('coord_write_mb_per_s'), ' MB/s', 1)}")
    pl, ll = g("points_lost"), g("lines_lost")
    row(scn, "metric points lost (sent − read by watchers); watcher updates skipped",
        f"{fmt(pl, digits=0)} of {fmt(g('points_sent'), digits=0)}; "
        f"{fmt(g('watch_updates_skipped'), digits=0)}", "0", (pl == 0) if pl is not None else None)
    row(scn, "log lines lost (sent − stored)",
        f"{fmt(ll, digits=0)} of {fmt(g('lines_sent'), digits=0)}", "0",
        (ll == 0) if ll is not None else None)
    return True


def main():
    res_txt, res_md = sys.argv[1], sys.argv[2]
    write = len(sys.argv) < 4 or sys.argv[3] != "0"
    r = load(res_txt)
    rows = []  # (scenario, metric, value, goal, verdict)

    def row(scn, metric, value, goal="", ok=None):
        if isinstance(ok, str):
            rows.append((scn, metric, value, goal, ok))
        else:
            rows.append((scn, metric, value, goal, "" if ok is None and not goal else verdict(ok)))

    # --- 1. heartbeats
    points = []
    for p in ("hb_small", "hb_mid", "hb_large"):
        tgt = num(r, f"{p}.workers_target")
        reg = num(r, f"{p}.workers_registered")
        if tgt is None:
            continue
        cpu = num(r, f"{p}.coord_cpu_cores")
        p99 = num(r, f"{p}.rtt.p99_ms")
        full = reg is not None and reg >= tgt and num(r, f"{p}.rtt.n") not in (None, 0)
        goal_ms = rtt_goal_ms(tgt)
        meets = full and cpu is not None and cpu < 1.0 and p99 is not None and p99 < goal_ms
        points.append((p, tgt, reg, full, meets))
        scn = f"heartbeat, {fmt(tgt, digits=0)} workers"
        row(scn, "workers registered (ramp)",
            f"{fmt(reg, digits=0)} in {fmt(num(r, f'{p}.ramp_s'), ' s')} "
            f"({fmt(num(r, f'{p}.ramp_registrations_per_s'), '/s', 0)}; register→ack p50 "
            f"{fmt(num(r, f'{p}.register_latency.p50_ms'), ' ms', 2)}, p99 "
            f"{fmt(num(r, f'{p}.register_latency.p99_ms'), ' ms')})",
            "all", full)
        row(scn, "heartbeats acknowledged",
            f"{fmt(num(r, f'{p}.acks_per_s'), '/s', 0)} of {fmt(num(r, f'{p}.heartbeats_per_s'), '/s', 0)} sent; "
            f"{fmt(num(r, f'{p}.streams_ended_in_window'), digits=0)} streams lost; interval the workers "
            f"were told {interval_text(r, p)}")
        row(scn, "coordinator CPU (steady window)", fmt(cpu, " cores", 3), "< 1 core",
            (cpu < 1.0) if cpu is not None else None)
        row(scn, "coordinator busiest threads (cores); avg threads waiting for a CPU",
            f"{r.get(f'{p}.coord.top_threads_cores', 'n/a')}; {fmt(num(r, f'{p}.coord.runqueue_wait_threads'), '', 2)}")
        row(scn, "load generator CPU (same machine); avg threads waiting for a CPU",
            f"{fmt(num(r, f'{p}.bench_cpu_cores'), ' cores', 3)}; {fmt(num(r, f'{p}.bench.runqueue_wait_threads'), '', 2)}")
        row(scn, "coordinator RSS / per worker",
            f"{fmt(num(r, f'{p}.coord_rss_mb'), ' MiB')} (idle {fmt(num(r, f'{p}.coord_rss_idle_mb'), ' MiB')}) / "
            f"{fmt(num(r, f'{p}.coord_kb_per_worker'), ' KiB')}")
        row(scn, "heartbeat round trip p50 / p99 / max",
            f"{fmt(num(r, f'{p}.rtt.p50_ms'), ' ms', 2)} / {fmt(p99, ' ms', 2)} / {fmt(num(r, f'{p}.rtt.max_ms'), ' ms')}",
            f"p99 < {goal_ms:.0f} ms", (p99 < goal_ms) if p99 is not None else None)
        loop_rows(r, p, row, scn)
        row(scn, "generator send lateness p50 / p99 (its own lag)",
            f"{fmt(num(r, f'{p}.send_lateness.p50_ms'), ' ms', 2)} / {fmt(num(r, f'{p}.send_lateness.p99_ms'), ' ms', 2)}")
        if num(r, f"{p}.mass_loss_workers"):
            row(scn, f"mass loss: {fmt(num(r, f'{p}.mass_loss_workers'), digits=0)} streams cut at once → all LOST",
                f"{fmt(num(r, f'{p}.mass_loss_all_lost_s'), ' s', 2)}; survivors' RTT p50 "
                f"{fmt(num(r, f'{p}.mass_loss_survivor_rtt.p50_ms'), ' ms')}, p99 "
                f"{fmt(num(r, f'{p}.mass_loss_survivor_rtt.p99_ms'), ' ms')}, max "
                f"{fmt(num(r, f'{p}.mass_loss_survivor_rtt.max_ms'), ' ms')}")
        if num(r, f"{p}.under_load.cut_to_failed.n"):
            m = num(r, f"{p}.under_load.last_hb_to_failed.max_ms")
            row(scn, "failure detection under this load: cut → attempt failed p50 / max; last heartbeat → failed p50 / max",
                f"{fmt(num(r, f'{p}.under_load.cut_to_failed.p50_ms'), ' ms', 0)} / "
                f"{fmt(num(r, f'{p}.under_load.cut_to_failed.max_ms'), ' ms', 0)}; "
                f"{fmt(num(r, f'{p}.under_load.last_hb_to_failed.p50_ms'), ' ms', 0)} / {fmt(m, ' ms', 0)} "
                f"(n={fmt(num(r, f'{p}.under_load.cut_to_failed.n'), digits=0)}, undetected "
                f"{fmt(num(r, f'{p}.under_load.undetected'), digits=0)})",
                "≤ 3 s", strict(m) if num(r, f"{p}.under_load.undetected") == 0 else "FAIL (undetected)")

    # --- 1d. telemetry at scale
    telemetry_rows(r, "tel", row)
    # --- 2. jobs
    for p in ("jobs", "jobs_wide"):
        if num(r, f"{p}.jobs_target") is None:
            continue
        g = lambda k: num(r, f"{p}.{k}")
        scn = f"{fmt(g('jobs_target'), digits=0)} queued jobs, {fmt(g('busy_workers'), digits=0)} busy workers"
        row(scn, f"jobs submitted (no free slot; {fmt(g('concurrency'), digits=0)} in flight)",
            f"{fmt(g('jobs_submitted'), digits=0)} in {fmt(g('submit_s'), ' s')} = "
            f"{fmt(g('submit_per_s'), '/s', 0)} (refused {fmt(g('jobs_refused'), digits=0)})")
        row(scn, "submissions/s per successive 1,000", r.get(f"{p}.submit_per_s_by_thousand", "n/a"))
        row(scn, "SubmitJob latency under the flood, first 1,000 / last 1,000 (p50, p99)",
            f"{fmt(g('submit_latency_first1000.p50_ms'), ' ms')}, {fmt(g('submit_latency_first1000.p99_ms'), ' ms')} / "
            f"{fmt(g('submit_latency_last1000.p50_ms'), ' ms')}, {fmt(g('submit_latency_last1000.p99_ms'), ' ms')}")
        row(scn, "coordinator CPU while submitting; busiest threads (cores)",
            f"{fmt(g('submit_coord_cpu_cores'), ' cores', 3)}; {r.get(f'{p}.submit_coord.top_threads_cores', 'n/a')}")
        row(scn, "coordinator RSS per queued job",
            f"{fmt(g('coord_kb_per_queued_job'), ' KiB', 2)} ({fmt(g('coord_rss_before_jobs_mb'), ' MiB')} → "
            f"{fmt(g('coord_rss_after_jobs_mb'), ' MiB')})")
        row(scn, "heartbeat RTT of the busy workers during the flood (p50 / p99 / max)",
            f"{fmt(g('busy_worker_rtt_during_submit.p50_ms'), ' ms')} / {fmt(g('busy_worker_rtt_during_submit.p99_ms'), ' ms')} / "
            f"{fmt(g('busy_worker_rtt_during_submit.max_ms'), ' ms')}")
        if g("flood_worker_lost.cut_to_failed_ms") is not None:
            m = g("flood_worker_lost.last_hb_to_failed_ms")
            after = g("flood_worker_lost.failed_after_flood_end_ms")
            when = ("n/a" if after is None else
                    f"{fmt(after, ' ms', 0)} after it ended" if after >= 0 else f"{fmt(-after, ' ms', 0)} before it ended")
            row(scn, "a busy worker dies halfway through the flood: death → attempt failed; last heartbeat → failed",
                f"{fmt(g('flood_worker_lost.cut_to_failed_ms'), ' ms', 0)}; {fmt(m, ' ms', 0)} "
                f"(flood had {fmt(g('flood_worker_lost.flood_left_at_cut_s'), ' s')} left; failed {when})",
                "≤ 3 s", strict(m))
        row(scn, "one SubmitJob with the queue full (p50 / p99)",
            f"{fmt(g('queued_submit_latency.p50_ms'), ' ms', 2)} / {fmt(g('queued_submit_latency.p99_ms'), ' ms', 2)}")
        row(scn, "GetJob / ListJobs(PENDING, 100) with the queue full (p50)",
            f"{fmt(g('queued_getjob_latency.p50_ms'), ' ms', 2)} / {fmt(g('queued_listjobs100_latency.p50_ms'), ' ms', 2)}")
        row(scn, "new worker: register sent → start_ranks (p50 / p99)",
            f"{fmt(g('new_worker_register_to_start_ranks.p50_ms'), ' ms', 2)} / "
            f"{fmt(g('new_worker_register_to_start_ranks.p99_ms'), ' ms', 2)} "
            f"(oldest first: latest submission placed #{fmt(g('new_worker_placed_max_submit_index'), digits=0)})")
        row(scn, "slot frees (rank SUCCEEDED) → next start_ranks (p50 / p99)",
            f"{fmt(g('freed_slot_to_start_ranks.p50_ms'), ' ms', 2)} / {fmt(g('freed_slot_to_start_ranks.p99_ms'), ' ms', 2)}")

    # --- 3. failure detection
    for key, label in (("stream_cut", "stream cancelled"), ("sigkill", "worker process SIGKILLed")):
        n = num(r, f"fail.{key}.cut_to_failed.n")
        if n is None:
            continue
        scn = f"failure detection: {label}"
        c = lambda s: num(r, f"fail.{key}.cut_to_failed.{s}_ms")
        h = lambda s: num(r, f"fail.{key}.last_hb_to_failed.{s}_ms")
        und = num(r, f"fail.{key}.undetected")
        row(scn, "death → attempt failed (min / p50 / p90 / max)",
            f"{fmt(c('min'), ' ms', 0)} / {fmt(c('p50'), ' ms', 0)} / {fmt(c('p90'), ' ms', 0)} / {fmt(c('max'), ' ms', 0)} "
            f"(n={fmt(n, digits=0)}; {fmt(num(r, f'fail.{key}.jobs_failed'), digits=0)} FAILED, "
            f"{fmt(num(r, f'fail.{key}.jobs_restarting'), digits=0)} RESTARTING, {fmt(und, digits=0)} undetected)")
        row(scn, "last heartbeat → attempt failed (min / p50 / max)",
            f"{fmt(h('min'), ' ms', 0)} / {fmt(h('p50'), ' ms', 0)} / {fmt(h('max'), ' ms', 0)}",
            "≤ 3 s", strict(h("max")) if und == 0 else "FAIL (undetected)")

    # --- 4. shutdown: does the coordinator exit on SIGTERM after each scenario?
    stops = [(k[len("stop."):], v) for k, v in r.items() if k.startswith("stop.")]
    if stops:
        hung = [n for n, v in stops if not v.startswith("exited")]
        row("coordinator shutdown", "SIGTERM after each scenario",
            "; ".join(f"{n}: {v}" for n, v in stops), "exits",
            "PASS" if not hung else f"FAIL ({len(hung)} of {len(stops)} hung)")

    # --- store backends: the telemetry scenario on SQLite and on PostgreSQL
    store_rows = []

    def srow(scn, metric, value, goal="", ok=None):
        store_rows.append((scn, metric, value, goal, "" if ok is None and not goal else verdict(ok)))

    has_pg = telemetry_rows(r, "telpg", srow, "PostgreSQL store")
    if has_pg:
        telemetry_rows(r, "tel", srow, "SQLite store")
        store_rows.sort(key=lambda x: 0 if x[0].endswith("SQLite store") else 1)  # SQLite first, rows kept in order
    elif r.get("telpg.exit", "").startswith("skipped"):
        print(f"telemetry on PostgreSQL: {r['telpg.exit']}")

    largest = max((p for p in points if p[4]), key=lambda p: p[1], default=None)
    largest_full = max((p for p in points if p[3]), key=lambda p: p[1], default=None)

    # --- print
    for table in (rows, store_rows):
        if not table:
            continue
        w = [max(len(x[i]) for x in table + [("scenario", "metric", "value", "goal", "result")]) for i in range(5)]
        hdr = ("scenario", "metric", "value", "goal", "result")
        print()
        print("  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)))
        for x in table:
            print("  ".join(v.ljust(w[i]) for i, v in enumerate(x)))

    if not write:
        return
    if has_pg:
        write_section(res_md, STORE_SECTION, store_section(r, store_rows))
    if not points:
        print(f"\nno heartbeat scenario in this run: the '{SECTION}' section is left as it was")
        return

    md = []
    md.append(SECTION)
    md.append("")
    md.append(f"Run {r.get('meta.date', '?')} by `bench/coordinator/run.sh` (commit {r.get('meta.commit', '?')}, "
              f"{r.get('meta.build', '?')} build, {fmt(num(r, 'meta.elapsed_s'), ' s', 0)} in all).")
    md.append(f"Machine: {r.get('meta.cores', '?')} cores ({r.get('meta.cpu', '?')}), loopback only; "
              f"coordinator and load generator share it (load average {r.get('meta.load_start', '?')} at the start, "
              f"{r.get('meta.load_end', '?')} at the end; the run itself keeps one to two cores busy, so a start above ~1 "
              f"means something else shared the machine).")
    md.append(f"Coordinator flags: `{r.get('meta.coordinator_flags', '?')}`, SQLite on local disk, "
              f"{grpc_text(r)}; each scenario gets a fresh coordinator and database. Simulated workers: one Session stream each, "
              "gRPC callback API, 16 channels, 4 timer threads; RTT = heartbeat written → heartbeat_ack read. "
              "'Threads waiting for a CPU' is run-queue time from /proc/PID/task/*/schedstat: above ~0.5 the "
              "machine, not the process, sets the latency.")
    if largest_full:
        md.append(f"Largest heartbeat point that ran in full (all registered, every heartbeat answered): "
                  f"**{fmt(largest_full[1], digits=0)} workers**; largest that also met both goals "
                  f"(coordinator < 1 core, RTT p99 < 50 ms up to 10,000 workers, < 200 ms beyond) on this shared machine: "
                  f"**{fmt(largest[1], digits=0) + ' workers' if largest else 'none'}**.")
    else:
        md.append("No heartbeat point completed in full.")
    md.append("")
    md.append("| scenario | metric | value | goal | result |")
    md.append("| --- | --- | --- | --- | --- |")
    for x in rows:
        md.append("| " + " | ".join(v.replace("|", "\\|") for v in x) + " |")
    if write_telemetry_series(r, os.path.join(os.path.dirname(os.path.abspath(res_md)), "plots")):
        plot = subprocess.run(["bash", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plot.sh")],
                              capture_output=True, text=True)
        if plot.returncode != 0:
            print(f"bench/plot.sh failed: {plot.stderr.strip()[-500:]}", file=sys.stderr)
        md.append("")
        md.append("Telemetry at scale, second by second through the steady window (the same run; "
                  "`bench/plot.sh` draws it from `plots/telemetry.dat`):")
        md.append("")
        md.append("![telemetry at scale](plots/telemetry.png)")
    md.append("")
    md.append("Notes (what the figures mean; measurements of earlier runs are in [HISTORY.md](HISTORY.md)):")
    md.append("- Failure detection: a session that breaks without a goodbye (the worker process was killed, "
              "its host or the network went away, or the load generator cancelled the stream) leaves the worker "
              "`--disconnect-grace-ms` to reconnect before it is LOST; a worker whose stream stays open but "
              "goes silent is LOST at its lease (`--lease-timeout-ms`). Leases are checked on a timer "
              "(`CoordinatorOptions::check_interval`), and the LOST worker and the failed attempt are written to "
              "SQLite before watchers hear of it. 'death' is when the generator cut the stream or SIGKILLed the "
              "worker; 'last heartbeat' is the last heartbeat the coordinator acknowledged before that.")
    md.append("- Lease checks are timers on the coordinator's event loop; a due timer runs before queued work, "
              "and scheduling passes are coalesced to one per loop turn.")
    md.append("- Every registration and every submission is a SQLite transaction with `synchronous=FULL` "
              "on the single event-loop thread; ramp and submission rates are bounded by the disk's fsync, "
              "and heartbeats queue behind them meanwhile.")
    md.append("- Coordinator loop rows: the coordinator's own `trainctl_loop_task_wait_seconds` and "
              "`trainctl_loop_task_run_seconds` histograms (/metrics, read by the generator at the start and the "
              "end of the steady window): how long a posted task (an RPC, a report) waited for the loop thread "
              "and how long each ran; timers are lease checks, scheduling passes and flushes. A quantile is the "
              "upper bound of the bucket it falls in.")
    md.append("- The coordinator and the load generator share this machine: when 'threads waiting for a CPU' "
              "is high, the machine, not the coordinator, sets the tail latency; compare the coordinator's "
              "busiest threads with one core.")
    if any(not v.startswith("exited") for k, v in r.items() if k.startswith("stop.")):
        md.append("- A coordinator did not exit on SIGTERM (see the shutdown row): look at the process with "
                  "gdb (`thread apply all bt`); HISTORY.md has the cause of an earlier such hang.")
    md.append("- Raw key=value results: printed by run.sh (`results.txt` in its work directory).")
    md.append("")
    write_section(res_md, SECTION, "\n".join(md) + "\n")


def grpc_text(r):
    """Which libgrpc the coordinator loaded (run.sh's COORDINATOR_LIB_DIR)."""
    path = r.get("meta.coordinator_grpc", "")
    if not path or path.startswith("/lib/") or path.startswith("/usr/lib/"):
        return "Debian's gRPC"
    return f"gRPC from `{path}` (COORDINATOR_LIB_DIR)"


def store_section(r, rows):
    md = [STORE_SECTION, ""]
    md.append(f"Run {r.get('meta.date', '?')} by `bench/coordinator/run.sh` (commit {r.get('meta.commit', '?')}, "
              f"{r.get('meta.build', '?')} build; scenarios: telemetry and telemetry_pg, one after the other).")
    md.append(f"The telemetry scenario twice on one machine ({r.get('meta.cores', '?')} cores, "
              f"{r.get('meta.cpu', '?')}; load average {r.get('meta.load_start', '?')} at the start, "
              f"{r.get('meta.load_end', '?')} at the end), the same load and coordinator flags "
              f"(`{r.get('meta.coordinator_flags', '?')}`, {grpc_text(r)}); what differs is the store: SQLite (WAL, "
              f"`synchronous=FULL`) in a file on local disk, or PostgreSQL {r.get('meta.pg_version', '?')} "
              "(Debian's server, defaults: `fsync` and `synchronous_commit` on) on the same disk, reached "
              "over a Unix socket. The PostgreSQL server's CPU (postmaster, the coordinator's backend, WAL "
              "writer, checkpointer) is counted separately from the coordinator's.")
    idle = num(r, "tel.idle_workers") or num(r, "telpg.idle_workers")
    if idle is not None and idle != 10000:
        md.append(f"Sized down: {fmt(idle, digits=0)} heartbeating workers beside the ranks instead of run.sh's "
                  "10,000 (`WORKERS_LARGE`), so that the shared machine could run both sides in full; the "
                  "telemetry load (ranks, points and log lines per second) is the default.")
    load = num(r, "meta.load_start")
    if load is not None and load > 1.5:
        md.append(f"A load average of {fmt(load, digits=2)} on {r.get('meta.cores', '?')} cores at the start means "
                  "other work (builds, tests) shared the machine during the run: both sides waited for a CPU "
                  "(see 'threads waiting'), so latencies are the machine's as much as the store's.")
    md.append("")
    md.append("| scenario | metric | value | goal | result |")
    md.append("| --- | --- | --- | --- | --- |")
    for x in rows:
        md.append("| " + " | ".join(v.replace("|", "\\|") for v in x) + " |")
    md.append("")
    return "\n".join(md) + "\n"


def write_section(res_md, title, section):
    """Replaces the section `title` of res_md (up to the next "## "), or appends it."""
    text = open(res_md).read() if os.path.exists(res_md) else "# Benchmark results\n\n"
    pat = re.compile(r"^" + re.escape(title) + r"\n.*?(?=^## |\Z)", re.S | re.M)
    if pat.search(text):
        text = pat.sub(lambda m: section + ("\n" if m.end() < len(text) else ""), text, count=1)
    else:
        if not text.endswith("\n"):
            text += "\n"
        if not text.endswith("\n\n"):
            text += "\n"
        text += section
    tmp = res_md + ".tmp-coordinator"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, res_md)
    print(f"\nwrote the '{title}' section of {res_md}")


if __name__ == "__main__":
    main()
