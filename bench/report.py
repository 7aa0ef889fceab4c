#!/usr/bin/env python3
"""Turns one bench/compare.sh run (JSON lines + its metadata) into the markdown section of
docs/benchmarks.md between <!-- compare:begin --> and <!-- compare:end -->.

Standard library only. Prints the section; with --doc, also replaces it in that file (appending
the markers at the end when the file has none yet).
"""

import argparse
import json
import sys
from pathlib import Path

BEGIN = "<!-- compare:begin -->"
END = "<!-- compare:end -->"

SYSTEMS = ["baton", "mariadb", "postgres", "etcd"]
NAMES = {"baton": "Baton", "mariadb": "MariaDB", "postgres": "PostgreSQL", "etcd": "etcd"}
WORKLOADS = ["permit-uniform", "permit-hot", "handoff", "queue-claim", "mixed-read"]

# Issue 6's targets: on these workloads and client counts, Baton's ops/s at least this many
# times each peer's, and Baton's p99 no higher than MariaDB's.
TARGET_WORKLOADS = {"permit-uniform", "permit-hot", "handoff"}
TARGET_CLIENTS = {16, 64}
TARGET_RATIO = {"mariadb": 2.0, "etcd": 10.0}


def load_runs(path):
    """The runs keyed by (workload, clients, system); later lines win."""
    runs = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        run = json.loads(line)
        runs[(run["workload"], int(run["clients"]), run["system"])] = run
    return runs


def number(value):
    return f"{value:,.0f}"


def ms(value):
    return f"{value:.2f}"


def usable(run):
    """Whether a run measured something comparable: it ran, completed operations, and (queue-claim)
    never found its queue empty, which would make its rate the queue's size, not its speed."""
    return (
        bool(run)
        and "error" not in run
        and run.get("ops", 0) > 0
        and run["ops_per_s"] > 0
        and run.get("empty_leases", 0) == 0
    )


def ratio(baton, peer):
    """Baton's ops/s over the peer's, or None when either run is not usable."""
    if not usable(baton) or not usable(peer):
        return None
    return baton["ops_per_s"] / peer["ops_per_s"]


def targeted(workload, clients):
    return workload in TARGET_WORKLOADS and clients in TARGET_CLIENTS


def verdicts(runs, workload, clients, system):
    """(target, met or None when unmeasurable, detail) for each target against `system`."""
    baton = runs.get((workload, clients, "baton"))
    peer = runs.get((workload, clients, system))
    found = []
    if not targeted(workload, clients) or system not in TARGET_RATIO:
        return found
    goal = TARGET_RATIO[system]
    r = ratio(baton, peer)
    found.append(
        (
            f"ops ≥ {goal:g}x {NAMES[system]}",
            None if r is None else r >= goal,
            "n/a" if r is None else f"{r:.2f}x",
        )
    )
    if system == "mariadb":
        if usable(baton) and usable(peer):
            met = baton["p99_ms"] <= peer["p99_ms"]
            detail = f"{ms(baton['p99_ms'])} vs {ms(peer['p99_ms'])} ms"
        else:
            met, detail = None, "n/a"
        found.append(("p99 ≤ MariaDB's", met, detail))
    return found


def word(met):
    return "n/a" if met is None else ("PASS" if met else "MISS")


def targets_table(runs, clients_seen):
    rows = []
    for workload in WORKLOADS:
        for clients in sorted(clients_seen):
            for system in ("mariadb", "etcd"):
                for target, met, detail in verdicts(runs, workload, clients, system):
                    if (workload, clients, "baton") in runs and (workload, clients, system) in runs:
                        rows.append(f"| {workload} | {clients} | {target} | {detail} | **{word(met)}** |")
    if not rows:
        return ["No cell of this run is one the targets name (permit-uniform, permit-hot and "
                "handoff at 16 and 64 clients, against MariaDB and etcd)."]
    passed = sum(1 for r in rows if r.endswith("**PASS** |"))
    return [
        f"{passed} of {len(rows)} targets met.",
        "",
        "| workload | clients | target | measured | verdict |",
        "| --- | ---: | --- | --- | --- |",
        *rows,
    ]


def workload_table(runs, workload, clients_seen):
    lines = [
        f"### {workload}",
        "",
        "| clients | system | ops/s | requests/s | contended/s | p50 ms | p99 ms | p999 ms | Baton ÷ system (ops/s) | targets |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for clients in sorted(clients_seen):
        baton = runs.get((workload, clients, "baton"))
        for system in SYSTEMS:
            run = runs.get((workload, clients, system))
            if run is None:
                continue
            if "error" in run:
                lines.append(f"| {clients} | {NAMES[system]} | failed: {run['error'].replace('|', '/')} | | | | | | | |")
                continue
            r = ratio(baton, run) if system != "baton" else None
            shown = "—" if system == "baton" else ("n/a" if r is None else f"{r:.2f}x")
            if not usable(run):
                empty = run.get("empty_leases", 0)
                shown += f" (not comparable: {number(empty)} leases found no task)" if empty else " (not comparable: no operation completed)"
            found = verdicts(runs, workload, clients, system)
            target = " · ".join(f"{t}: {word(m)}" for t, m, _ in found) or ""
            lines.append(
                f"| {clients} | {NAMES[system]} | {number(run['ops_per_s'])} | {number(run['requests_per_s'])}"
                f" | {number(run.get('contended_per_s', 0))} | {ms(run['p50_ms'])} | {ms(run['p99_ms'])}"
                f" | {ms(run['p999_ms'])} | {shown} | {target} |"
            )
    return lines


def section(runs, meta):
    clients_seen = {k[1] for k in runs}
    workloads_seen = [w for w in WORKLOADS if any(k[0] == w for k in runs)]
    quick = meta.get("quick") == "1"
    out = [
        BEGIN,
        f"## Side by side with MariaDB, PostgreSQL and etcd ({meta.get('date', '?')})",
        "",
        "<!-- Generated by bench/report.py from bench/compare.sh; edits here are overwritten. -->",
        "",
    ]
    if quick:
        out += [
            "> **Quick validation run** (`--quick`: 2-second cells): these figures only show that",
            "> the harness works end to end. They are not measurements; run the full matrix.",
            "",
        ]
    out += [
        f"Command: `{meta.get('command', 'bench/compare.sh')}` — every cell {meta.get('duration')}"
        f" measured after {meta.get('warmup')} of warm-up, the systems one after the other"
        " inside each cell, each client a closed loop (a peer's client with its own connection;"
        " Baton's clients share one client library, which batches concurrent calls); queue-claim starts"
        f" from {int(meta.get('queue_tasks', 0)):,} queued tasks. Raw results:"
        f" `bench/results/{meta.get('date', '?')}.jsonl`.",
        "",
        f"Machine: {meta.get('nproc')} cores ({meta.get('cpu')}), {meta.get('memory')} of memory,"
        f" Linux {meta.get('kernel')}; data on {meta.get('disk')}; a 4 KiB write + fdatasync there"
        f" took {meta.get('fsync_ms')}. The servers, Baton's three nodes and the load drivers all"
        " share these cores.",
        "",
        "Versions: " + "; ".join(
            part
            for part in [
                f"Baton {meta.get('baton_version')}",
                meta.get("mariadb_version") and f"MariaDB {meta['mariadb_version']}",
                meta.get("postgres_version") and f"PostgreSQL {meta['postgres_version']}",
                meta.get("etcd_version") and f"etcd {meta['etcd_version']}",
                meta.get("driver") and f"peer driver built with {meta['driver']}",
            ]
            if part
        )
        + ".",
        "",
        "One op is the same on every system (bench/README.md gives each one's statements): a",
        "permit claim + release pair, a ticket offer + take + reply, a queue lease + completion, or",
        "(mixed-read) one read or one permit pair. Requests are round trips to the server;",
        "latency percentiles are per request. Contended: claims that found the permit held.",
        "",
        "### Targets (issue 6)",
        "",
        *targets_table(runs, clients_seen),
        "",
    ]
    for workload in workloads_seen:
        out += workload_table(runs, workload, clients_seen) + [""]
    out += ["### Settings", ""]
    out.append(
        "- Baton: `baton bench` starts three `baton node` processes in a temporary directory;"
        " every write is fsynced on a quorum before it is acknowledged."
    )
    for key, name in (("mariadb", "MariaDB"), ("postgres", "PostgreSQL")):
        settings = meta.get(f"{key}_settings")
        if settings:
            out += [f"- {name} (one durable server; clients over TCP on loopback):", "", "  ```"]
            out += [f"  {line}" for line in settings.splitlines() if line.strip()]
            out += ["  ```"]
    if meta.get("etcd_settings"):
        out.append(f"- etcd: {meta['etcd_settings']}.")
    out += ["", END]
    return "\n".join(out) + "\n"


def replace_section(doc, text):
    path = Path(doc)
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    if BEGIN in current and END in current:
        head, rest = current.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        updated = head + text.rstrip("\n") + tail
    else:
        updated = current.rstrip("\n") + "\n\n" + text
    path.write_text(updated, encoding="utf-8")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", required=True, help="the run's JSON lines")
    parser.add_argument("--meta", required=True, help="the run's metadata (JSON)")
    parser.add_argument("--doc", help="markdown file whose compare section to regenerate")
    args = parser.parse_args()
    runs = load_runs(args.results)
    meta = json.loads(Path(args.meta).read_text(encoding="utf-8"))
    text = section(runs, meta)
    sys.stdout.write(text)
    if args.doc:
        replace_section(args.doc, text)
        print(f"report: regenerated the compare section of {args.doc}", file=sys.stderr)


if __name__ == "__main__":
    main()
