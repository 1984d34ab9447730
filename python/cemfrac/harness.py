"""Any cemfrac checkpoint as a model of EleutherAI's lm-evaluation-harness (docs/interop.md).

    python -m cemfrac.harness run --model cemfrac --model_args checkpoint=runs/x,device=cpu \\
        --tasks wikitext lambada_openai hellaswag

is the harness's own command line (`lm_eval run ...`, the same flags) with the model "cemfrac"
registered: the harness finds models by a name registered in the process that runs it, and has no
plugin hook, so the module runs the harness's CLI after registering it. From Python:

    import lm_eval, cemfrac.harness
    lm_eval.simple_evaluate(model="cemfrac", model_args="checkpoint=runs/x", tasks=[...])

model_args: checkpoint (a run directory or a checkpoint; required), device (cpu, cuda, cuda:N),
batch_size (rows per forward, default 8), max_gen_toks (default 256), set ("model.cem.steps=4", several
separated by ';': the architecture fields `cemfrac eval --set` may change).

Requests are scored by the code `cemfrac eval --task` uses (score_requests), so the harness's metrics on
a task equal what cemfrac reports on the same data: every context starts with the end-of-text id (the
harness adds one only to an empty context; cemfrac's documents all follow one, so this is how its
models saw every start); loglikelihood_rolling uses the harness's disjoint windows; generate_until
decodes a batch with the decode cache (greedy unless do_sample) and cuts at the first stop string.
Needs lm-eval (pip install lm-eval; tested with 0.4.13, scripts/pip-interop.txt).
"""
import sys
from typing import Dict, List, Tuple

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from .model import load, loglikelihood_request, rolling_requests


@register_model("cemfrac")
class CemfracLM(LM):
    def __init__(self, checkpoint=None, device="cpu", batch_size=8, max_gen_toks=256, set="",
                 **unused):
        super().__init__()
        if not checkpoint:
            raise ValueError("cemfrac: model_args needs checkpoint=RUN_OR_CHECKPOINT_DIR")
        overrides = [s for s in str(set or "").split(";") if s]
        self.model = load(str(checkpoint), overrides, str(device or "cpu"))
        self._device = str(device or "cpu")
        self.tok = self.model.tokenizer
        if self.tok is None:
            raise ValueError(f"cemfrac: {checkpoint} has no tokenizer, so the harness's text cannot "
                             "be encoded")
        self.batch = 8 if batch_size in (None, "auto") else int(str(batch_size).split(":")[0])
        self.max_gen_toks = int(max_gen_toks)
        self.context = int(self.model.config["context"])

    @property
    def tokenizer_name(self) -> str:
        return self.tok.id

    def _score(self, requests) -> List[Tuple[float, int, bool]]:
        return self.model.score(requests, self.batch)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> List[Tuple[float, bool]]:
        reqs = [loglikelihood_request(self.tok, ctx, cont) for ctx, cont in (r.args for r in requests)]
        return [(ll, greedy) for ll, _, greedy in self._score(reqs)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> List[float]:
        reqs, owner = [], []
        for i, r in enumerate(requests):
            windows = rolling_requests(self.tok, r.args[0], self.context)
            reqs += windows
            owner += [i] * len(windows)
        sums = [0.0] * len(requests)
        for i, (ll, _, _) in zip(owner, self._score(reqs)):
            sums[i] += ll
        return sums

    def generate_until(self, requests, disable_tqdm: bool = False) -> List[str]:
        out: List[str] = [""] * len(requests)
        groups: Dict[str, List[int]] = {}
        for i, r in enumerate(requests):  # one batch per distinct set of generation settings
            groups.setdefault(repr(sorted(r.args[1].items())), []).append(i)
        for rows in groups.values():
            kw = dict(requests[rows[0]].args[1])
            until = kw.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            n = int(kw.pop("max_gen_toks", self.max_gen_toks))
            sample = bool(kw.pop("do_sample", False))
            temperature = float(kw.pop("temperature", 1.0 if sample else 0.0)) if sample else 0.0
            keep = max(1, self.context - n)  # the harness's left cut: room for n new tokens
            prompts = [([self.tok.eot_id] + self.tok.encode(requests[i].args[0]))[-keep:] for i in rows]
            gens = self.model.generate(prompts, n, temperature=temperature,
                                       top_k=int(kw.pop("top_k", 0) or 0),
                                       top_p=float(kw.pop("top_p", 1.0) or 1.0),
                                       seed=int(kw.pop("seed", 0) or 0))
            for i, ids in zip(rows, gens):
                text = self.tok.decode(ids)
                for stop in until:
                    if stop and stop in text:
                        text = text[:text.index(stop)]
                out[i] = text
        return out


def main(argv=None) -> int:
    """The harness's command line with "cemfrac" registered. The harness passes its own --device
    (default cuda:0) and --batch_size to every model, so device= and batch_size= written in
    --model_args are moved to those flags (naming both is an error). A run that names no device gets
    cuda when torch sees a GPU and cpu otherwise, and says so; a device named explicitly is used as
    named (cuda without a GPU is an error naming it)."""
    import torch
    from lm_eval.__main__ import cli_evaluate
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "run":
        for i in range(len(args) - 1):
            if args[i] != "--model_args":
                continue
            kept = []
            for kv in args[i + 1].split(","):
                key, _, value = kv.partition("=")
                if key in ("device", "batch_size"):
                    flag = "--" + key
                    if any(a == flag or a.startswith(flag + "=") for a in args):
                        raise SystemExit(f"cemfrac.harness: {key} is given both in --model_args and "
                                         f"as {flag}: give it once")
                    args += [flag, value]
                else:
                    kept.append(kv)
            args[i + 1] = ",".join(kept)
        if not any(a == "--device" or a.startswith("--device=") for a in args):
            device = "cuda" if torch.cuda.is_available() else "cpu"
            print(f"cemfrac.harness: --device {device} (none given)", file=sys.stderr)
            args += ["--device", device]
    sys.argv = ["lm_eval"] + args
    cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
