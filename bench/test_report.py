"""Checks of bench/report.py (stdlib unittest): `python3 bench/test_report.py`."""

import tempfile
import unittest
from pathlib import Path

import report


def run(system, workload, clients, ops, p99):
    return {
        "system": system,
        "workload": workload,
        "clients": clients,
        "ops": ops * 8,
        "ops_per_s": ops,
        "requests_per_s": ops * 2,
        "contended_per_s": 0.0,
        "p50_ms": p99 / 4,
        "p99_ms": p99,
        "p999_ms": p99 * 2,
    }


def runs_of(*items):
    return {(r["workload"], r["clients"], r["system"]): r for r in items}


class Verdicts(unittest.TestCase):
    def test_ratio_and_p99_against_mariadb(self):
        runs = runs_of(
            run("baton", "handoff", 16, 2000, 5.0),
            run("mariadb", "handoff", 16, 1000, 4.0),
        )
        found = report.verdicts(runs, "handoff", 16, "mariadb")
        self.assertEqual([(t, m) for t, m, _ in found],
                         [("ops ≥ 2x MariaDB", True), ("p99 ≤ MariaDB's", False)])

    def test_etcd_needs_ten_times(self):
        runs = runs_of(
            run("baton", "permit-hot", 64, 900, 1.0),
            run("etcd", "permit-hot", 64, 100, 9.0),
        )
        [(_, met, detail)] = report.verdicts(runs, "permit-hot", 64, "etcd")
        self.assertFalse(met)
        self.assertEqual(detail, "9.00x")

    def test_untargeted_cells_have_no_verdict(self):
        runs = runs_of(run("baton", "queue-claim", 16, 1, 1), run("mariadb", "queue-claim", 16, 1, 1))
        self.assertEqual(report.verdicts(runs, "queue-claim", 16, "mariadb"), [])
        runs = runs_of(run("baton", "handoff", 1, 1, 1), run("mariadb", "handoff", 1, 1, 1))
        self.assertEqual(report.verdicts(runs, "handoff", 1, "mariadb"), [])

    def test_a_failed_cell_is_not_a_pass(self):
        failed = {"system": "mariadb", "workload": "handoff", "clients": 16, "error": "exit 1"}
        runs = runs_of(run("baton", "handoff", 16, 2000, 1.0), failed)
        self.assertTrue(all(m is None for _, m, _ in report.verdicts(runs, "handoff", 16, "mariadb")))
        self.assertIn("failed: exit 1", "\n".join(report.workload_table(runs, "handoff", {16})))

    def test_a_run_that_completed_nothing_is_not_a_pass(self):
        # A p99 of 0 ms from an empty histogram must not beat MariaDB's.
        nothing = dict(run("baton", "handoff", 16, 0, 0.0), ops=0)
        runs = runs_of(nothing, run("mariadb", "handoff", 16, 1000, 4.0))
        self.assertTrue(all(m is None for _, m, _ in report.verdicts(runs, "handoff", 16, "mariadb")))

    def test_a_queue_that_ran_dry_is_not_compared(self):
        dry = dict(run("postgres", "queue-claim", 16, 900, 1.0), empty_leases=5000)
        runs = runs_of(run("baton", "queue-claim", 16, 1600, 8.0), dry)
        self.assertIsNone(report.ratio(runs[("queue-claim", 16, "baton")], dry))
        table = "\n".join(report.workload_table(runs, "queue-claim", {16}))
        self.assertIn("not comparable: 5,000 leases found no task", table)


class Section(unittest.TestCase):
    def test_replaces_only_between_the_markers(self):
        with tempfile.TemporaryDirectory() as tmp:
            doc = Path(tmp) / "b.md"
            doc.write_text(f"before\n{report.BEGIN}\nold\n{report.END}\nafter\n", encoding="utf-8")
            report.replace_section(doc, f"{report.BEGIN}\nnew\n{report.END}\n")
            self.assertEqual(doc.read_text(encoding="utf-8"),
                             f"before\n{report.BEGIN}\nnew\n{report.END}\nafter\n")

    def test_appends_the_markers_when_absent(self):
        with tempfile.TemporaryDirectory() as tmp:
            doc = Path(tmp) / "b.md"
            doc.write_text("# Benchmarks\n", encoding="utf-8")
            report.replace_section(doc, f"{report.BEGIN}\nnew\n{report.END}\n")
            self.assertTrue(doc.read_text(encoding="utf-8").endswith(f"{report.BEGIN}\nnew\n{report.END}\n"))

    def test_quick_runs_say_so(self):
        runs = runs_of(run("baton", "handoff", 16, 2000, 1.0), run("mariadb", "handoff", 16, 500, 2.0))
        text = report.section(runs, {"quick": "1", "queue_tasks": "10000"})
        self.assertIn("Quick validation run", text)
        self.assertIn("4.00x", text)
        self.assertIn("**PASS**", text)


if __name__ == "__main__":
    unittest.main()
