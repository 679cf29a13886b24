#!/usr/bin/env python3
"""Usage: scripts/score-bench.py URL MODEL PROMPTS LENGTH

Times lm-eval-style scoring requests (`echo: true, logprobs: 1, max_tokens: 1`) against plain
ones (`max_tokens: 1`) on distinct token-id prompts of LENGTH tokens, alternated, one at a time,
and prints the medians (docs/results.md)."""
import json, statistics, sys, time, urllib.request

url, model, n_prompts, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def post(body):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req) as r:
        out = json.load(r)
    return time.perf_counter() - t, out

times = {"scored": [], "plain": []}
for i in range(n_prompts):
    # Distinct prompts (no prefix-cache reuse between them): ids from a simple generator.
    ids = [(7919 * (i + 1) * (j + 3)) % 40000 + 100 for j in range(length)]
    for kind in (["scored", "plain"] if i % 2 == 0 else ["plain", "scored"]):
        body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0}
        if kind == "scored":
            body.update({"echo": True, "logprobs": 1})
        else:
            ids = [t + 1 for t in ids]  # not the prompt just computed
            body["prompt"] = ids
        dt, out = post(body)
        if kind == "scored":
            assert len(out["choices"][0]["logprobs"]["tokens"]) == length + 1
        times[kind].append(dt)
for kind, ts in times.items():
    print(f"{kind}: median {statistics.median(ts)*1000:.1f} ms over {len(ts)} requests of {length} prompt tokens")
print(f"ratio scored/plain: {statistics.median(times['scored'])/statistics.median(times['plain']):.2f}x")
