"""Does the model find what it should? Each of the review's holes put back into the product, one
at a time, in a scratch worktree, and the named cases (the decider's and the watcher's tables,
the model's found cases) and then the model explored against it on fixed seeds:

    python -m tests.model.mutants [--examples N] [NAME ...]

runs on the committed HEAD and prints, per mutant, the first case that failed (and the
invariant, where the model broke one), and how long it took. A mutant nothing catches names a
rule, a case or an invariant that is missing. Not a test: it runs for minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Run before the exploration: the named cases, seconds each.
CASES = ("tests/unit/test_decider.py", "tests/unit/test_watcher.py", "tests/model/test_found.py")
# name: (file, the code as it is, the hole put back), and the hole it stands for.
MUTANTS: dict[str, tuple[str, str, str, str]] = {
    "witness_ignored": (
        "aggregator/decide/decider.py",
        "                kubelets,\n                margin_s=params.witness_margin_s,",
        "                None,\n                margin_s=params.witness_margin_s,",
        "1: the kubelets not asked",
    ),
    "witness_reads_once": (
        "aggregator/decide/decider.py",
        "silent = said.silent_by(stale, kubelets.read_at if look.confirming and kubelets is not None else"
        " now)",
        "silent = stale",
        "1: pending nodes counted silent",
    ),
    "release_leaves_verdict": (
        "aggregator/model/eligibility.py",
        '        return "its agent has not renewed yet"\n',
        '        return "its agent has not renewed yet"\n'
        "    if lease.view.released and now - lease.seen_renewed_mono >= params.lease_duration_s:\n"
        '        return "released by its agent"\n',
        "56.1: a release shrinks the denominator",
    ),
    "release_counts_unwitnessed": (
        "aggregator/decide/decider.py",
        "now >= expiry[n] and (witnessed or not lease.view.released)",
        "now >= expiry[n]",
        "56.1: a release alone counted stale",
    ),
    "release_of_ours_only": (
        "aggregator/observe/watcher.py",
        "            chosen = _released_by_either(chosen, own if chosen is legacy else legacy)\n",
        "",
        "56.1: the old layout's lease judged unreleased",
    ),
    "release_waits_allowance": (
        "aggregator/decide/decider.py",
        "stale_at(lease, params, answered=n in answered)",
        "stale_at(lease, params, answered=False)",
        "64: a cut as the agents roll waits the allowance",
    ),
    "release_judged_unanswered": (
        "aggregator/decide/decider.py",
        "stale_at(lease, params, answered=n in answered)",
        "stale_at(lease, params, answered=True)",
        "64: a release judged where no kubelet answers",
    ),
    "roll_told_as_failing": (
        "aggregator/decide/decider.py",
        "    alive = said.alive - {n for n, lease in counted.items() if lease.view.released}\n",
        "    alive = said.alive\n",
        "64: a roll told as agents failing",
    ),
    "released_slack_plain": (
        "aggregator/decide/decider.py",
        "params.witness_slack_s * RELEASED_SLACK_FACTOR",
        "params.witness_slack_s",
        "64: a released node's late-writing kubelet called silent",
    ),
    "released_alive_until_read": (
        "aggregator/decide/decider.py",
        "overdue = {n for n, due in rolled.alive_due.items() if due <= now}",
        "overdue: set[str] = set()",
        "64: a released node alive until the next read",
    ),
    "round_by_arrival": (
        "aggregator/observe/watcher.py",
        "    if a is not None and b is not None:\n",
        "    if False:\n",
        "64: a round of renewals told by the watches",
    ),
    "blind_never_restores": (
        "aggregator/decide/phases.py",
        "if now - blind_since >= params.blind_limit_s:",
        "if False:",
        "2: blind for good, held for good",
    ),
    "release_ignores_writes": (
        "aggregator/lead/leader.py",
        "if not await self.hold.writes.settled(self._settle_s):",
        "if False:",
        "3: a Lease released with writes in flight",
    ),
    "converged_never_looks": (
        "aggregator/act/scaler.py",
        "return not any(s is not None and s.record is not None for s in seen)",
        "return True",
        "3: a converged actuator never looks again",
    ),
    "records_from_watch": (
        "aggregator/act/scaler.py",
        "        for d in self.dependents:\n            await self.replicas.get(d)\n        return any(",
        "        return any(",
        "3: a takeover trusts a watch that is behind",
    ),
    "no_memory": (
        "aggregator/observe/replicas.py",
        "if (record := self._lowered.get(state.name)) is None:",
        "if (record := None) is None:",
        "4a: a lost annotation forgotten",
    ),
    "label_only_not_ours": (
        "aggregator/observe/replicas.py",
        "else (from_label(str(label)) if label is not None else None),",
        "else None,",
        "4: our label alone not our mark",
    ),
    "label_without_count": (
        "aggregator/model/records.py",
        '    return str(record.replicas) if record.replicas is not None else "true"',
        '    return "true"',
        "4: a record whose annotations were wiped",
    ),
    "restore_hibernated": (
        "aggregator/act/orphans.py",
        "if skipped := self.skipped_because(namespace):",
        "if False:",
        "5: the sweep raises a hibernated shoot",
    ),
    "overload_gaps": (
        "aggregator/act/interlocks.py",
        "if (late := self._overloaded(started, probed, listed)) is not None:",
        "if (late := None) is not None:",
        "6: our own overload read as the shoot's",
    ),
}


def run(name: str, examples: int, tree: Path) -> tuple[str, float]:
    path, old, new, _ = MUTANTS[name]
    subprocess.run(["git", "-C", str(tree), "checkout", "-q", "--", "."], check=True)
    subprocess.run(["git", "-C", str(tree), "clean", "-fdq", "tests/model/examples"], check=True)
    source = tree / path
    text = source.read_text()
    if text.count(old) != 1:
        return f"stale mutant: {path} no longer has its code once", 0.0
    source.write_text(text.replace(old, new))
    started = time.monotonic()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "not DryRun and not every_mutant",
            *CASES,
            "tests/model/test_model.py",
        ],
        check=False,
        cwd=tree,
        env=dict(os.environ, PYTHONPATH=str(tree), DWDDEV_MODEL_EXAMPLES=str(examples)),
        capture_output=True,
        text=True,
    )
    took = time.monotonic() - started
    if out.returncode == 0:
        return "not caught", took
    failed = re.findall(r"^FAILED (\S+)", out.stdout, re.M)
    broke = re.findall(r"\b(I[1-7])\b[^\n]{0,100}", out.stdout)
    by = failed[0].split("::")[-1] if failed else out.stdout.strip().splitlines()[-1]
    return f"caught by {by}" + (f": {broke[0]}" if broke else ""), took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"mutants to run (default: all): {', '.join(MUTANTS)}")
    ap.add_argument("--examples", type=int, default=150, help="sequences explored per mutant")
    args = ap.parse_args()
    if unknown := sorted(set(args.names) - MUTANTS.keys()):
        ap.error(f"no such mutant: {', '.join(unknown)}")
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree)], check=True)
        try:
            print(f"{'mutant':<24} {'hole':<42} {'s':>5}  result")
            for name in args.names or list(MUTANTS):
                result, took = run(name, args.examples, tree)
                print(f"{name:<24} {MUTANTS[name][3]:<42} {took:5.0f}  {result[:110]}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


if __name__ == "__main__":
    main()
