#!/usr/bin/env python3
"""Prints the job folders of a `cemfrac compare` output folder that are finished, one per line, for
keeping a suite in the repository without its checkpoints (docs/compare.md, "Jobs, threads,
resuming"):

    git add $(scripts/suite_finished.py configs/suites/cem.toml results/cem) \
        results/cem/results.* results/cem/plots

A folder is finished when a later invocation will reuse it as it is: a timing or grid run whose
training completed or diverged (or whose GP result exists), and a final run that diverged, or that
completed and holds every evaluation the suite asks of it (its split, each test-time variant, each
eval text of the suite file, each zero-shot task and each fine-tuning seed; one given only with
--eval-text is not seen). A final run that completed but is still missing an evaluation is left out: without its
checkpoint it could not be evaluated later. Stop the suite first (Ctrl-C) so that nothing is half
written. Needs only Python 3.11's standard library.
"""
import json
import os
import sys
import tomllib


def status(folder):
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            return json.load(f).get("status", "")
    except (OSError, ValueError):
        return ""


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: suite_finished.py SUITE.toml OUT_FOLDER")
    suite_path, out = sys.argv[1], sys.argv[2]
    with open(suite_path, "rb") as f:
        suite = tomllib.load(f)
    head = suite.get("suite", {})
    split = head.get("eval_split", "test")
    texts = [os.path.splitext(os.path.basename(t))[0] for t in head.get("eval_text", [])]
    builtin = ("brown-cloze", "brown-mc", "brown-rolling")  # cemfrac/eval/brown_tasks.h
    tasks = [t if t in builtin else os.path.splitext(os.path.basename(t))[0]
             for t in head.get("tasks", [])]
    finetunes = [(f["name"], f.get("seeds", [1])) for f in suite.get("finetune", [])]
    runs = {r["name"]: r for r in suite.get("run", [])}

    def done_job(folder):
        if os.path.exists(os.path.join(folder, "gp-run.json")):
            return True
        return status(folder) in ("completed", "diverged")

    found = []
    for phase in ("plan", "lr"):
        root = os.path.join(out, phase)
        for dirpath, dirnames, _ in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "checkpoints"]
            if done_job(dirpath):
                found.append(dirpath)
                dirnames[:] = []
    final = os.path.join(out, "final")
    for name in sorted(os.listdir(final)) if os.path.isdir(final) else []:
        run = runs.get(name, {})
        variants = [f"T={t}" for t in run.get("test_time_steps", [])]
        variants += [v["name"] for v in run.get("variants", [])]
        for seed_dir in sorted(os.listdir(os.path.join(final, name))):
            folder = os.path.join(final, name, seed_dir)
            if run.get("task") == "gp":
                if os.path.exists(os.path.join(folder, "gp-run.json")):
                    found.append(folder)
                continue
            st = status(folder)
            if st == "diverged":
                found.append(folder)
            elif st == "completed":
                needed = [f"eval-{split}.json"] + [f"eval-{split}@{v}.json" for v in variants]
                needed += [f"eval-text-{t}.json" for t in texts]
                needed += [f"task-{t}.json" for t in tasks]
                needed += [f"ft-{n}/seed-{k}/finetune.json" for n, seeds in finetunes for k in seeds]
                if all(os.path.exists(os.path.join(folder, n)) for n in needed):
                    found.append(folder)
    print("\n".join(found))


if __name__ == "__main__":
    main()
