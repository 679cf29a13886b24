"""dspark through the official `openai` Python client.

Run by server/tests/openai_client.rs against a live `dspark serve`; DSPARK_URL and
DSPARK_MODEL say where. Every check raises on failure, so the exit status is the verdict.
"""

import json
import os
import re

import openai

client = openai.OpenAI(base_url=os.environ["DSPARK_URL"] + "/v1", api_key="unused")
MODEL = os.environ["DSPARK_MODEL"]
USER = [{"role": "user", "content": "Describe a city."}]

# Chat, plain.
r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, temperature=0)
assert r.choices[0].finish_reason == "length", r
assert r.usage.completion_tokens == 8, r.usage
assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content

# json_schema with strict: the answer parses and has the schema's shape.
schema = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "population": {"type": "integer", "minimum": 0},
        "coastal": {"type": "boolean"},
    },
    "required": ["city", "population", "coastal"],
    "additionalProperties": False,
}
r = client.chat.completions.create(
    model=MODEL,
    messages=USER,
    max_tokens=200,
    temperature=0,
    response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}},
)
assert r.choices[0].finish_reason == "stop", r
city = json.loads(r.choices[0].message.content)
assert set(city) == {"city", "population", "coastal"}, city
assert isinstance(city["population"], int) and city["population"] >= 0
assert isinstance(city["coastal"], bool) and len(city["city"]) <= 30

# json_object.
r = client.chat.completions.create(
    model=MODEL, messages=USER, max_tokens=300, temperature=0, response_format={"type": "json_object"}
)
if r.choices[0].finish_reason == "stop":
    assert isinstance(json.loads(r.choices[0].message.content), dict)

# vLLM's structured_outputs through extra_body: regex and choice.
r = client.chat.completions.create(
    model=MODEL, messages=USER, max_tokens=20, extra_body={"structured_outputs": {"regex": r"[A-Z][a-z]{2,8}"}}
)
assert re.fullmatch(r"[A-Z][a-z]{2,8}", r.choices[0].message.content), r.choices[0].message.content
r = client.chat.completions.create(
    model=MODEL, messages=USER, max_tokens=20, extra_body={"structured_outputs": {"choice": ["north", "south"]}}
)
assert r.choices[0].message.content in ("north", "south")

# Streaming with usage.
stream = client.chat.completions.create(
    model=MODEL, messages=USER, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
)
text, usage, finish = "", None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
assert usage is not None and usage.completion_tokens == 12, usage
assert finish == "length" and text

# Log-probabilities.
r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
content = r.choices[0].logprobs.content
assert len(content) == 4 and all(len(t.top_logprobs) == 2 for t in content)

# Legacy completions.
r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0)
assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5

# Scoring a prompt the way lm-evaluation-harness does: token ids, echo, one generated token.
ids = [[504, 3575, 282, 4649, 314]]
r = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0, logprobs=1, echo=True)
lp = r.choices[0].logprobs
assert len(lp.tokens) == len(ids[0]) + 1 and lp.token_logprobs[0] is None, lp
assert all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:]), lp
assert r.choices[0].text == "".join(lp.tokens) and lp.text_offset[0] == 0, r
for token, logprob, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
    assert top[token] == logprob and len(top) <= 2, top

# Errors map to the client's exception types.
try:
    client.chat.completions.create(model="no-such-model", messages=USER)
    raise AssertionError("expected NotFoundError")
except openai.NotFoundError as e:
    assert e.body["code"] == "model_not_found", e.body
try:
    client.chat.completions.create(model=MODEL, messages=USER, temperature=9)
    raise AssertionError("expected BadRequestError")
except openai.BadRequestError as e:
    assert e.body["param"] == "temperature", e.body

assert [m.id for m in client.models.list()] == [MODEL]
print("openai client: all checks passed")
