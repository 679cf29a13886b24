"""Tool calling through the official `openai` Python client.

Run by server/tests/openai_client.rs against a live `dspark serve` of Qwen2.5-Coder (its chat
template writes Hermes `<tool_call>` blocks). Every check raises on failure. Each emitted
`arguments` string is checked against its tool's schema here (the schemas are small enough
to check by hand) and by the server's own validator, whose failure count the Rust side reads.
"""

import json
import os

import openai

client = openai.OpenAI(base_url=os.environ["DSPARK_URL"] + "/v1", api_key="unused")
MODEL = os.environ["DSPARK_MODEL"]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 40},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in an IANA time zone",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z_]+$"}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
WEATHER = [{"role": "user", "content": "What is the weather like in Paris and in Tokyo?"}]


def check_call(name, arguments):
    """Raises unless `arguments` (a JSON string) is valid for tool `name`."""
    args = json.loads(arguments)
    assert isinstance(args, dict), arguments
    if name == "get_weather":
        assert set(args) == {"city", "unit"}, args
        assert isinstance(args["city"], str) and len(args["city"]) <= 40, args
        assert args["unit"] in ("celsius", "fahrenheit"), args
    elif name == "get_time":
        assert set(args) == {"zone"}, args
        zone = args["zone"]
        area, _, city = zone.partition("/")
        assert area[:1].isupper() and area[1:].isalpha() and area[1:].islower(), zone
        assert city[:1].isupper() and all(c.isalpha() or c == "_" for c in city), zone
    else:
        raise AssertionError(f"unknown tool {name}")
    return args


def create(**kw):
    kw.setdefault("max_tokens", 160)
    return client.chat.completions.create(model=MODEL, temperature=0, tools=TOOLS, **kw)


# required: one or more calls, each valid. The answer ends with finish_reason tool_calls when
# the model stops calling; Qwen2.5-0.5B, greedy, given its real `</tool_call>` token, goes on
# calling tools to the token limit, and then the reason is length and every call listed is
# whole. (The cases below where the constraint ends the answer check tool_calls exactly.)
r = create(messages=WEATHER, tool_choice="required")
choice = r.choices[0]
assert choice.finish_reason in ("tool_calls", "length"), choice
if choice.finish_reason == "length":
    assert r.usage.completion_tokens == 160, r.usage
calls = choice.message.tool_calls
assert calls and all(c.type == "function" and c.id for c in calls), calls
assert len({c.id for c in calls}) == len(calls), "tool call ids are unique"
for c in calls:
    check_call(c.function.name, c.function.arguments)
print(f"required: {[(c.function.name, c.function.arguments) for c in calls]}")

# parallel_tool_calls: false: exactly one call.
r = create(messages=WEATHER, tool_choice="required", parallel_tool_calls=False)
assert r.choices[0].finish_reason == "tool_calls"
assert len(r.choices[0].message.tool_calls) == 1, r.choices[0].message.tool_calls

# A named function: exactly one call, of that function.
r = create(messages=WEATHER, tool_choice={"type": "function", "function": {"name": "get_time"}})
calls = r.choices[0].message.tool_calls
assert len(calls) == 1 and calls[0].function.name == "get_time", calls
check_call("get_time", calls[0].function.arguments)

# none: text only, no calls, even though the template shows the tools.
r = create(messages=[{"role": "user", "content": "Say hello."}], tool_choice="none", max_tokens=20)
assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
assert r.choices[0].finish_reason in ("stop", "length")

# auto: free text or calls; whatever comes, calls are valid and text is text.
r = create(messages=WEATHER, tool_choice="auto")
message = r.choices[0].message
for c in message.tool_calls or []:
    check_call(c.function.name, c.function.arguments)
assert message.tool_calls or message.content, message

# Streaming: the name and id arrive in a call's first delta, the arguments in pieces.
stream = create(messages=WEATHER, tool_choice="required", stream=True)
calls, finish, argument_deltas = {}, None, 0
for chunk in stream:
    for choice in chunk.choices:
        finish = choice.finish_reason or finish
        for d in choice.delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.function.name, d
                calls[d.index] = {"name": d.function.name, "arguments": d.function.arguments or ""}
            else:
                assert d.id is None and not d.function.name, d
                calls[d.index]["arguments"] += d.function.arguments or ""
                argument_deltas += 1
assert finish in ("tool_calls", "length") and calls, (finish, calls)
# Cut at the token limit, the last call's arguments stop where the limit fell.
whole = list(calls.values())[: len(calls) - (finish == "length")]
assert whole, calls
for c in whole:
    check_call(c["name"], c["arguments"])
assert argument_deltas >= 2, f"the arguments arrived in {argument_deltas} pieces"

# Streaming one call: the constraint ends the answer, and the last chunk says tool_calls.
stream = create(messages=WEATHER, tool_choice="required", parallel_tool_calls=False, stream=True)
finishes = [c.finish_reason for chunk in stream for c in chunk.choices if c.finish_reason]
assert finishes == ["tool_calls"], finishes

# A multi-turn conversation: the call and its result go back through the chat template.
first = create(messages=[{"role": "user", "content": "What is the weather like in Paris?"}], tool_choice="required")
call = first.choices[0].message.tool_calls[0]
history = [
    {"role": "user", "content": "What is the weather like in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}],
    },
    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "sunny"})},
]
r = create(messages=history, tool_choice="auto", max_tokens=60)
message = r.choices[0].message
for c in message.tool_calls or []:
    check_call(c.function.name, c.function.arguments)
assert message.tool_calls or message.content, message
longer = r.usage.prompt_tokens - first.usage.prompt_tokens
assert longer > 20, f"the tool call and result added only {longer} prompt tokens"

# Errors name the field.
try:
    create(messages=WEATHER, tool_choice={"type": "function", "function": {"name": "nope"}})
    raise AssertionError("expected BadRequestError")
except openai.BadRequestError as e:
    assert e.body["param"] == "tool_choice", e.body
try:
    client.chat.completions.create(
        model=MODEL, messages=WEATHER, tools=[{"type": "function", "function": {"name": "bad name"}}]
    )
    raise AssertionError("expected BadRequestError")
except openai.BadRequestError as e:
    assert e.body["param"] == "tools[0].function.name", e.body

print("openai tools: all checks passed")
