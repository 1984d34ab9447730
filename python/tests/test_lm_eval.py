"""cemfrac as a model of the real lm-evaluation-harness (lm-eval 0.4.13, scripts/pip-interop.txt): task
YAMLs over local JSONL files (no hub), run by the harness with model "cemfrac", give the metrics
`cemfrac eval --task` reports on the same files: acc, acc_norm and acc_bytes (multiple choice, with
choices whose characters and bytes differ), acc and perplexity (cloze), word_perplexity,
byte_perplexity and bits_per_byte (rolling); generate_until gives cemfrac's greedy continuation cut at
the stop string; the harness's command line runs through `python -m cemfrac.harness`.

scripts/pip-leg.sh runs this with CEMFRAC_INTEROP_REQUIRED=1: there a missing lm-eval is an error.
"""
import json
import math
import os
import subprocess
import sys

import pytest

from _support import CEMFRAC_EXE, cemfrac, cli, tiny_corpus, train_tiny

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: nothing may reach the hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    import lm_eval
    from lm_eval.tasks import TaskManager
    import cemfrac.harness  # noqa: F401  (registers the model "cemfrac")
except ImportError as e:  # pragma: no cover - depends on the machine
    if os.environ.get("CEMFRAC_INTEROP_REQUIRED") == "1":
        raise
    pytest.skip(f"lm-eval not importable ({e}): pip install -r scripts/pip-interop.txt",
                allow_module_level=True)

pytestmark = pytest.mark.skipif(not os.path.exists(CEMFRAC_EXE), reason=f"no {CEMFRAC_EXE}")

# Multiple-choice candidates whose characters and bytes differ; the fixture picks pairs on which the
# three readings (summed, per character, per byte) disagree for the trained model.
CANDIDATES = [" it did", " \u00f1and\u00fa", " that an election", " conducted", " z\u00f6\u00eb",
              " atlanta", " the", " \u00e9l\u00e8ve", " find", " jury said", " \u00e7a", " \u00e9",
              " city of", " xq", " \u00fc\u00fcber", " was"]
CONTEXTS = ["The jury said", "An election was", "The city of", "It did"]
CLOZE = [{"context": "The jury", "target": " said"}, {"context": "An election was", "target": " conducted"},
         {"context": "The city of", "target": " atlanta"}, {"context": "It", "target": " did find"}]
ROLLING = [{"text": "The jury said it did find that an election was conducted in the city of Atlanta. " * 3},
           {"text": "An election  was\tconducted.\n\nThe jury said it did. "}]
GEN = [{"context": "The jury said", "target": " it"}, {"context": "An election", "target": " was"}]

YAML = {
    "cemfrac_mc": """output_type: multiple_choice
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{gold}}"
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
  - metric: acc_bytes
""",
    "cemfrac_cloze": """output_type: loglikelihood
doc_to_text: "{{context}}"
doc_to_target: "{{target}}"
target_delimiter: ""
metric_list:
  - metric: perplexity
  - metric: acc
""",
    "cemfrac_rolling": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
""",
    "cemfrac_gen": """output_type: generate_until
doc_to_text: "{{context}}"
doc_to_target: "{{target}}"
target_delimiter: ""
generation_kwargs:
  until: [" the"]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - metric: exact_match
""",
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_eval")
    data = tiny_corpus(root, ("sp:300",))["sp:300"]
    run = train_tiny(root / "run", data, "tiny-llama")
    mc = choose_mc(cemfrac.load(run))
    tasks = root / "tasks"
    tasks.mkdir()
    for name, rows in [("cemfrac_mc", mc), ("cemfrac_cloze", CLOZE), ("cemfrac_rolling", ROLLING),
                       ("cemfrac_gen", GEN)]:
        jsonl = tasks / f"{name}.jsonl"
        jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (tasks / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {jsonl}\n"
            f"test_split: test\n" + YAML[name])
    return {"run": run, "tasks": tasks}


def choose_mc(model):
    """Examples where acc_norm (per character) and acc_bytes (per byte) pick different choices (gold
    on the per-character pick for 4, the per-byte pick for 2), plus 4 where both normalised readings
    agree with each other and not with the summed log-likelihood (gold on theirs): a harness and a
    cemfrac that normalised differently could not agree on all three metrics."""
    tok = model.tokenizer
    rows, split_norm, split_sum = [], [], []
    for ctx in CONTEXTS:
        ll = {c: r[0] for c, r in zip(CANDIDATES, model.score(
            [cemfrac.loglikelihood_request(tok, ctx, c) for c in CANDIDATES]))}
        for i, a in enumerate(CANDIDATES):
            for b in CANDIDATES[i + 1:]:
                by_char = max((a, b), key=lambda c: ll[c] / len(c))
                by_byte = max((a, b), key=lambda c: ll[c] / len(c.encode()))
                by_sum = max((a, b), key=lambda c: ll[c])
                if by_char != by_byte:
                    split_norm.append((ctx, a, b, by_char, by_byte))
                elif by_sum != by_char:
                    split_sum.append((ctx, a, b, by_char, by_byte))
    assert len(split_norm) >= 4 and len(split_sum) >= 2, (len(split_norm), len(split_sum))
    # acc_norm scores 4 + 4 of these 10, acc_bytes 2 + 4, acc at most 6 (never the 4 in split_sum)
    for k, (ctx, a, b, by_char, by_byte) in enumerate(split_norm[:6] + split_sum[:4]):
        gold = by_byte if k in (2, 5) else by_char
        rows.append({"context": ctx, "choices": [a, b], "gold": [a, b].index(gold)})
    return rows


def ours(setup, name):
    r = cli("eval", "--checkpoint", str(setup["run"]), "--task", str(setup["tasks"] / f"{name}.jsonl"),
            "--json")
    return json.loads(r.stdout)["metrics"]


def test_harness_metrics_equal_cemfrac_eval_task(setup):
    names = ["cemfrac_mc", "cemfrac_cloze", "cemfrac_rolling"]
    out = lm_eval.simple_evaluate(model="cemfrac", model_args=f"checkpoint={setup['run']},batch_size=3",
                                  tasks=names, task_manager=TaskManager(include_path=str(setup["tasks"])))
    res = out["results"]
    mc, cloze, roll = (ours(setup, n) for n in names)
    for key in ("acc", "acc_norm", "acc_bytes"):
        assert math.isclose(res["cemfrac_mc"][f"{key},none"], mc[key], rel_tol=1e-12), key
        assert math.isclose(res["cemfrac_mc"][f"{key}_stderr,none"], mc[f"{key}_stderr"], rel_tol=1e-9)
    # the data separates the three readings (choose_mc), so a swapped normalisation cannot pass
    assert mc["acc_norm"] == 0.8 and mc["acc_bytes"] == 0.6 and mc["acc"] <= 0.6, mc
    assert math.isclose(res["cemfrac_cloze"]["acc,none"], cloze["acc"], rel_tol=1e-12)
    assert math.isclose(res["cemfrac_cloze"]["perplexity,none"], cloze["perplexity"], rel_tol=1e-5)
    for key in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert math.isclose(res["cemfrac_rolling"][f"{key},none"], roll[key], rel_tol=1e-5), key


def test_generate_until_is_greedy_decoding_cut_at_the_stop(setup):
    out = lm_eval.simple_evaluate(model="cemfrac", model_args=f"checkpoint={setup['run']}",
                                  tasks=["cemfrac_gen"], log_samples=True,
                                  task_manager=TaskManager(include_path=str(setup["tasks"])))
    model = cemfrac.load(setup["run"])
    tok = model.tokenizer
    samples = sorted(out["samples"]["cemfrac_gen"], key=lambda s: s["doc_id"])
    assert len(samples) == len(GEN)
    for sample, row in zip(samples, GEN):
        ids = model.generate([[tok.eot_id] + tok.encode(row["context"])], 12)[0]
        want = tok.decode(ids).split(" the")[0]
        assert sample["resps"][0][0] == want


def test_the_harness_command_line(setup, tmp_path):
    r = subprocess.run([sys.executable, "-m", "cemfrac.harness", "run", "--model", "cemfrac",
                        "--model_args", f"checkpoint={setup['run']},batch_size=2",
                        "--tasks", "cemfrac_mc", "--include_path", str(setup["tasks"]),
                        "--output_path", str(tmp_path / "out")],
                       capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "cemfrac_mc" in r.stdout and "acc_norm" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "cemfrac.harness", "run", "--model", "cemfrac",
                          "--model_args", "device=cpu", "--tasks", "cemfrac_mc",
                          "--include_path", str(setup["tasks"])], capture_output=True, text=True)
    assert bad.returncode != 0 and "checkpoint=" in bad.stderr
