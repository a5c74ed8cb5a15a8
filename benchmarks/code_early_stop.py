"""Greedy code completions with and without the early stop (evaluation/tasks.code_pass): the
embedded SmolLM2 on the 12 default code-en problems x 128 tokens, batches of 8 and 12, one thread;
checks that the truncated completions are the same.

Usage: taskset -c 0 .venv/bin/python benchmarks/code_early_stop.py
"""
import time, torch
torch.set_num_threads(1)
from quantkit.evaluation.checkpoint import load_model, load_tokenizer, resolve_dir
from quantkit.evaluation.models import greedy, pad_id
from quantkit.evaluation.slices import load_suite
from quantkit.evaluation.code_exec import stops_body, truncate_completion
base_dir = resolve_dir(None)
tok = load_tokenizer(base_dir, base_dir)
base = load_model(base_dir, "cpu")
sl = load_suite("code-en")[0]
prompts = [tok(it["prompt"])["input_ids"] for it in sl.of_kind("code")][:12]
pad, eos = pad_id(tok), tok.eos_token_id
fin = lambda ids: stops_body(tok.decode(ids, skip_special_tokens=True))
for b in (8, 12):
    t=time.perf_counter(); full=[g for s in range(0,12,b) for g in greedy(base, prompts[s:s+b], 128, pad, eos)]; t1=time.perf_counter()-t
    t=time.perf_counter(); early=[g for s in range(0,12,b) for g in greedy(base, prompts[s:s+b], 128, pad, eos, stop=fin)]; t2=time.perf_counter()-t
    same=[truncate_completion(tok.decode(a, skip_special_tokens=True))==truncate_completion(tok.decode(c, skip_special_tokens=True)) for a,c in zip(full,early)]
    print("batch", b, f"full {t1:.1f}s early {t2:.1f}s", "same", all(same), [len(g) for g in early], flush=True)
