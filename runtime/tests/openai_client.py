"""The official `openai` Python client against `tessera serve`.

Run by runtime/tests/server_openai.rs as `python3 openai_client.py BASE_URL MODEL`
with the pinned client (installed by .ci/setup under target/tools/openai-*/) on
PYTHONPATH. Exercises both endpoints, streaming and not, with usage, logprobs,
n and stop strings, response_format and tools (streaming and not), and the
client's error classes for bad input. Prints one
line per check and exits non-zero on the first failure.
"""

import json
import sys

import openai
from openai import OpenAI

BASE_URL, MODEL = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=BASE_URL + "/v1", api_key="unused", timeout=60, max_retries=0)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)
    checks += 1
    print(f"ok: {what}", flush=True)


models = client.models.list()
check([m.id for m in models.data] == [MODEL], f"models.list() lists {MODEL}")

# Completions, non-streaming and streaming (greedy, so they must agree).
greedy = dict(model=MODEL, prompt="The quick brown fox", max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
c = client.completions.create(**greedy)
text = c.choices[0].text
check(isinstance(text, str) and c.choices[0].finish_reason == "length", "completions.create: text, finish_reason length")
check(c.usage.completion_tokens == 10 and c.usage.total_tokens == c.usage.prompt_tokens + 10, "completions usage")

chunks = list(client.completions.create(**greedy, stream=True, stream_options={"include_usage": True}))
streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
check(streamed == text, f"streamed completion equals the non-streamed one ({text!r})")
check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10, "stream usage chunk")
finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
check(finishes == ["length"], "one finish_reason in the stream")

c = client.completions.create(**greedy, logprobs=2)
lp = c.choices[0].logprobs
check(len(lp.token_logprobs) == 10 and all(len(t) <= 2 for t in lp.top_logprobs), "completion logprobs")

c = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0.8, seed=3, n=3,
                              extra_body={"ignore_eos": True})
check([ch.index for ch in c.choices] == [0, 1, 2] and c.usage.completion_tokens == 15, "n=3 choices")

# Chat completions, non-streaming and streaming.
messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
chat = dict(model=MODEL, messages=messages, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
r = client.chat.completions.create(**chat)
reply = r.choices[0].message.content
check(r.choices[0].message.role == "assistant" and isinstance(reply, str), "chat.completions.create")
check(r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 10, "chat usage")

stream = client.chat.completions.create(**chat, stream=True, stream_options={"include_usage": True})
parts = []
usage = None
for ch in stream:
    if ch.usage:
        usage = ch.usage
    for choice in ch.choices:
        parts.append(choice.delta.content or "")
check("".join(parts) == reply, f"streamed chat equals the non-streamed reply ({reply!r})")
check(usage is not None and usage.completion_tokens == 8, "chat stream usage")

r = client.chat.completions.create(**chat, logprobs=True, top_logprobs=3)
content = r.choices[0].logprobs.content
check(len(content) == 8 and all(len(t.top_logprobs) == 3 for t in content), "chat logprobs")

if len(reply) > 3:
    stop = reply[2:4]
    r = client.chat.completions.create(**chat, stop=[stop])
    check(r.choices[0].message.content == reply[: reply.find(stop)] and r.choices[0].finish_reason == "stop",
          f"stop string {stop!r}")

# Bad input maps to the client's error classes.
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    check(False, "unknown model is an error")
except openai.NotFoundError as e:
    check(e.status_code == 404 and "no-such-model" in e.message, "unknown model -> NotFoundError (404)")
try:
    client.completions.create(model=MODEL, prompt="x", max_tokens=1, temperature=5)
    check(False, "temperature 5 is an error")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "temperature" in e.message, "temperature 5 -> BadRequestError (400)")
try:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x " * 1200}])
    check(False, "a prompt beyond the context is an error")
except openai.BadRequestError as e:
    check(e.code == "context_length_exceeded", "prompt beyond the context -> context_length_exceeded")

# Structured output: response_format on both endpoints, streaming and not.
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
          "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "n"], "additionalProperties": False}
rf = {"type": "json_schema", "json_schema": {"name": "item", "schema": schema, "strict": True}}
ask = dict(model=MODEL, messages=[{"role": "user", "content": "An item?"}], max_tokens=80, temperature=0)
r = client.chat.completions.create(**ask, response_format=rf)
text = r.choices[0].message.content
obj = json.loads(text)
check(r.choices[0].finish_reason == "stop" and set(obj) == {"name", "n"} and len(obj["name"]) <= 6
      and 0 <= obj["n"] <= 99, f"response_format json_schema ({text!r})")
parts = [ch.choices[0].delta.content or "" for ch in client.chat.completions.create(**ask, response_format=rf, stream=True)
         if ch.choices]
check("".join(parts) == text, "streamed json_schema output equals the non-streamed one")
c = client.completions.create(model=MODEL, prompt="Item:", max_tokens=80, temperature=0,
                              extra_body={"response_format": rf})
check(c.choices[0].finish_reason == "stop" and set(json.loads(c.choices[0].text)) == {"name", "n"},
      "completions with response_format")
r = client.chat.completions.create(**ask, response_format={"type": "json_object"})
out = r.choices[0].message.content
check(out.startswith("{") and (r.choices[0].finish_reason != "stop" or isinstance(json.loads(out), dict)),
      "response_format json_object")
try:
    client.chat.completions.create(**ask, response_format={"type": "json_schema",
                                   "json_schema": {"name": "bad", "schema": {"type": "frob"}}})
    check(False, "an invalid schema is an error")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "response_format" in e.message, "invalid schema -> BadRequestError (400)")

# Tools: required and named choices give tool_calls, streaming and not; auto answers.
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                         "required": ["city"], "additionalProperties": False}}}]
q = dict(model=MODEL, messages=[{"role": "user", "content": "Weather in Oslo?"}], max_tokens=120, temperature=0,
         tools=tools, parallel_tool_calls=False)
for choice in ["required", {"type": "function", "function": {"name": "get_weather"}}]:
    r = client.chat.completions.create(**q, tool_choice=choice)
    calls = r.choices[0].message.tool_calls
    check(r.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and calls[0].function.name == "get_weather"
          and len(json.loads(calls[0].function.arguments)["city"]) <= 8, f"tool_choice {choice}: tool_calls")
    name, args, finish = None, "", None
    for ch in client.chat.completions.create(**q, tool_choice=choice, stream=True):
        if not ch.choices:
            continue
        for d in ch.choices[0].delta.tool_calls or []:
            name = d.function.name or name
            args += d.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    check(finish == "tool_calls" and name == "get_weather" and args == calls[0].function.arguments,
          f"tool_choice {choice}: streamed delta.tool_calls")
r = client.chat.completions.create(**q, tool_choice="auto")
check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), "tool_choice auto answers")
follow = [{"role": "user", "content": "Weather in Oslo?"},
          {"role": "assistant", "content": None, "tool_calls": [{"id": calls[0].id, "type": "function",
           "function": {"name": "get_weather", "arguments": calls[0].function.arguments}}]},
          {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"}]
r = client.chat.completions.create(model=MODEL, messages=follow, max_tokens=5, temperature=0, tools=tools)
check(r.choices[0].message.role == "assistant", "a tool result in the conversation")

print(f"openai {openai.__version__}: {checks} checks passed", flush=True)
