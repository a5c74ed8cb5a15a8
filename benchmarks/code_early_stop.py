"""Greedy code completions with and without the early stop (evaluation/tasks.code_pass): the
embedded SmolLM2 on the 12 default code-en problems x 128 tokens, batches of 8 and 12, one thread;
checks that the truncated completions are the same.

Usage: taskset -c 0 .venv/bin/python benchmarks/code_early_stop.py
"""
import argparse
import time

import torch

from quantkit.evaluation.checkpoint import load_model, load_tokenizer, resolve_dir
from quantkit.evaluation.code_exec import stops_body, truncate_completion
from quantkit.evaluation.causal_lm import greedy, pad_id
from quantkit.evaluation.slices import load_suite

PROBLEMS, NEW_TOKENS = 12, 128


def completions(model, prompts, batch, pad, eos, stop=None):
    out = []
    for start in range(0, len(prompts), batch):
        out += greedy(model, prompts[start:start + batch], NEW_TOKENS, pad, eos, stop=stop)
    return out


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    torch.set_num_threads(1)
    base_dir = resolve_dir(None)
    tok = load_tokenizer(base_dir, base_dir)
    base = load_model(base_dir, "cpu")
    code = load_suite("code-en")[0].of_kind("code")
    prompts = [tok(it["prompt"])["input_ids"] for it in code][:PROBLEMS]
    pad, eos = pad_id(tok), tok.eos_token_id

    def body_ended(ids) -> bool:
        return stops_body(tok.decode(ids, skip_special_tokens=True))

    def cut(ids) -> str:
        return truncate_completion(tok.decode(ids, skip_special_tokens=True))

    for batch in (8, 12):
        t = time.perf_counter()
        full = completions(base, prompts, batch, pad, eos)
        t_full = time.perf_counter() - t
        t = time.perf_counter()
        early = completions(base, prompts, batch, pad, eos, stop=body_ended)
        t_early = time.perf_counter() - t
        same = all(cut(a) == cut(b) for a, b in zip(full, early))
        print(f"batch {batch}: full {t_full:.1f} s, early stop {t_early:.1f} s; truncated completions "
              f"the same: {same}; tokens per completion {[len(g) for g in early]}", flush=True)


if __name__ == "__main__":
    main()
