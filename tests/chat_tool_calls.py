"""Tool calls in chat data against transformers' apply_chat_template(messages, tools=tools), part
of tests/chat_check.py (CTest Chat.MatchesApplyChatTemplate), which passes itself as `h` for its
helpers (folder, template_file, hf_tokenizer, reference, tool, compare, text, fail).

Records made here, in the OpenAI form: assistant messages with "tool_calls" ([{"type":
"function", "function": {"name", "arguments"}}], the arguments an object, or a string of JSON or of
any text), a null or empty content beside them, "tool" messages (one or several in a row), a
record's "tools" list (function schemas with keys in no sorted order, Unicode, floats such as
1e+16 and 1e-05, quotes and control characters in strings; also [] and null), several rounds,
system prompts, reasoning_content, and {"prompt", "completion"} records whose completion calls a
tool. Llama 3.1 and 3.2 get one call a message (their templates raise on more); Qwen 2.5 and 3
also parallel calls. For each template the ids, and the masks of train_on assistant and last (a
tool-call turn is an assistant turn; tool responses are not), equal the reference's.
"""
import json
import random

FLOATS = [1.5, 0.1, 1e16, 1e15, 1e-05, 0.0001, -0.0, 2.5e-7, 123456.789, 1e22, 3.0]
STRINGS = ["Paris", "naïve café", "日本語", "say \"hi\"", "back\\slash", "tab\there", "line\nbreak",
           "\x01ctl", "emoji 👩‍💻", "<tool_call>", "</tool_response>", "", " spaced "]
KEYS = ["city", "unit", "zeta", "alpha", "données", "q", "limit", "nested", "B", "a"]


def value(rng, depth=0):
    r = rng.random()
    if depth < 2 and r < 0.15:
        return {rng.choice(KEYS): value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if depth < 2 and r < 0.25:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if r < 0.45:
        return rng.choice(FLOATS)
    if r < 0.6:
        return rng.choice([0, 7, -3, 2**40, 2**63 - 1])
    if r < 0.7:
        return rng.choice([True, False, None])
    return rng.choice(STRINGS)


def arguments(rng):
    args = {k: value(rng) for k in rng.sample(KEYS, rng.randint(0, 4))}
    r = rng.random()
    if r < 0.25:
        return json.dumps(args, ensure_ascii=rng.random() < 0.5)
    if r < 0.35:
        return json.dumps(args, separators=(",", ":"))
    if r < 0.4:
        return rng.choice(["not json {", "", "日本 \"x\"\n"])
    return args


def tool_schema(rng, name):
    props = {k: {"type": rng.choice(["string", "number"]), "description": rng.choice(STRINGS)}
             for k in rng.sample(KEYS, rng.randint(0, 3))}
    function = {"name": name, "description": rng.choice(STRINGS) + " " + rng.choice(STRINGS),
                "parameters": {"type": "object", "properties": props,
                               "required": sorted(props)[:1]}}
    if rng.random() < 0.3:
        function["strict"] = rng.choice([True, False])
    if rng.random() < 0.3:
        function = dict(reversed(list(function.items())))
    return {"type": "function", "function": function}


def calling(rng, h, names, parallel):
    n = rng.randint(1, 3) if parallel and rng.random() < 0.5 else 1
    calls = [{"type": "function", "function": {"name": rng.choice(names),
                                                "arguments": arguments(rng)}} for _ in range(n)]
    if rng.random() < 0.3:
        calls[0]["id"] = "call_" + str(rng.randint(0, 999))
    m = {"role": "assistant", "tool_calls": calls}
    r = rng.random()
    m["content"] = None if r < 0.3 else "" if r < 0.5 else h.text(rng)
    if rng.random() < 0.2:
        m["reasoning_content"] = h.text(rng)
    return m


def tool_round(rng, h, names, parallel):
    msgs = [{"role": "user", "content": h.text(rng)}]
    for _ in range(rng.randint(1, 2)):
        call = calling(rng, h, names, parallel)
        msgs.append(call)
        for _ in call["tool_calls"] if parallel else range(1):
            msgs.append({"role": "tool", "content": h.text(rng) if rng.random() < 0.7 else
                         json.dumps({"temperature": rng.choice(FLOATS)})})
    if rng.random() < 0.8:
        reply = {"role": "assistant", "content": h.text(rng)}
        if parallel and rng.random() < 0.2:
            reply["tool_calls"] = rng.choice([None, []])  # none, as transformers reads them
        msgs.append(reply)
    return msgs


def record(rng, h, parallel):
    names = ["get_weather", "search", "add"]
    msgs = [{"role": "system", "content": h.text(rng)}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 2)):
        if rng.random() < 0.7:
            msgs += tool_round(rng, h, names, parallel)
        else:
            msgs += [{"role": "user", "content": h.text(rng)},
                     {"role": "assistant", "content": h.text(rng)}]
    r = rng.random()
    out = {"messages": msgs}
    if r < 0.7:
        out["tools"] = [tool_schema(rng, n) for n in names[:rng.randint(1, 3)]]
    elif r < 0.8:
        out["tools"] = []
    elif r < 0.9:
        out["tools"] = None
    if rng.random() < 0.15:  # a prompt and a completion that calls a tool
        cut = max(i for i, m in enumerate(msgs) if m["role"] == "user") + 1
        if cut < len(msgs) and msgs[cut]["role"] == "assistant":
            out["prompt"], out["completion"] = msgs[:cut], msgs[cut:]
            del out["messages"]
    return out


def without_null_content(r):
    """The record with a null content as "" (Qwen 3's first template raises on null; trainer
    renders both as the updated one does)."""
    r = json.loads(json.dumps(r))
    for key in ("messages", "prompt", "completion"):
        for m in r.get(key, []):
            if m.get("content") is None:
                m["content"] = ""
    return r


# template -> (vocabulary, records' family: parallel calls or not, extra reference arguments)
TEMPLATES = {"llama3.1-instruct": ("llama3", False, {}),
             "llama3.2-instruct": ("llama3", False, {"date_string": "03 Mar 2025"}),
             "qwen2.5-instruct": ("qwen3", True, {}), "qwen3": ("qwen3", True, {}),
             "qwen3-first-release": ("qwen3", True, {})}


def check_tool_calls(chat_tool, work, vocab, h):
    rng = random.Random(52)
    files = {}
    for parallel in (False, True):
        recs = [record(rng, h, parallel) for _ in range(40)]
        path = f"{work}/tools-{'parallel' if parallel else 'single'}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        files[parallel] = (path, recs)
    for name, (voc, parallel, kw) in TEMPLATES.items():
        path, recs = files[parallel]
        config = h.template_file(name)
        d = h.folder(work, "tools-" + name, vocab[voc], config)
        t = h.hf_tokenizer(vocab[voc], config)
        fix = without_null_content if name == "qwen3-first-release" else (lambda r: r)
        want = {f"{path}:{i + 1}": h.reference(t, fix(r), **kw) for i, r in enumerate(recs)}
        extra = [f"chat_date={kw['date_string']}"] if kw else []
        for mode in ("assistant", "last"):
            rc, err, got, _ = h.tool(chat_tool, f"{work}/out", f"root={path}", f"tokenizer={d}",
                                     f"train_on={mode}", "dump=conversations", *extra)
            if rc != 0:
                h.fail(f"tool calls, {name} {mode}: exit {rc}: {err[-500:]}")
                continue
            h.compare(f"tool calls, {name} train_on {mode}", got, want, mode, err)


def bad_cases(good, work):
    """(lines, settings, exit status, text of the message) of tool records that are refused, each
    naming the file and line, and of those accepted."""
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    user = {"role": "user", "content": "2+1?"}
    calls = {"role": "assistant", "content": None, "tool_calls": [call]}
    answer = {"role": "assistant", "content": "3"}
    tools = [{"type": "function", "function": {"name": "add", "description": "a+b",
                                               "parameters": {"type": "object"}}}]
    chatml, llama = [f"tokenizer={work}/tpl-chatml"], [f"tokenizer={work}/tpl-llama3.1-instruct"]
    line = json.dumps

    def called(**kw):
        return line({"messages": [user, dict(calls, tool_calls=[dict(call, **kw)])]})

    return [
        ([good, line({"messages": [user, calls]})], chatml, 2,
         "bad.jsonl:2: messages[1].tool_calls: the chatml chat template renders no tool calls"),
        ([good, line({"messages": [user, answer], "tools": tools})], chatml, 2,
         'bad.jsonl:2: "tools": the chatml chat template renders no tool definitions'),
        ([good, line({"messages": [user, {"role": "tool", "content": "3"}, answer]})], chatml, 2,
         'bad.jsonl:2: messages[1].role: "tool" is not a role the chatml chat template'),
        ([good, line({"messages": [user, answer], "tools": []})], chatml, 0, ""),
        ([line({"messages": [user, dict(calls, tool_calls=[call, call])]})], llama, 2,
         "bad.jsonl:1: messages[1].tool_calls: 2 calls in one message: the llama3.1 chat "
         "template renders one"),
        ([good, line({"messages": [{"role": "system", "content": "s"}, answer, user, answer],
                      "tools": tools})], llama, 2,
         "bad.jsonl:2: messages[1].role: the llama3.1 chat template puts the tool definitions"),
        ([good, line({"messages": [{"role": "system", "content": "s"}], "tools": tools})], llama,
         2, 'bad.jsonl:2: "tools": the llama3.1 chat template puts the tool definitions into'),
        ([good, line({"messages": [dict(user, tool_calls=[call]), answer]})], [], 2,
         "bad.jsonl:2: messages[0] has tool_calls: only an assistant message calls tools"),
        ([good, line({"messages": [user, dict(calls, tool_calls=call)]})], [], 2,
         "bad.jsonl:2: messages[1].tool_calls must be a list of calls, got an object"),
        ([good, called(function={"name": "add", "arguments": [1, 2]})], [], 2,
         "bad.jsonl:2: messages[1].tool_calls[0].function.arguments must be an object or a "
         "string of JSON, got a list"),
        ([good, line({"messages": [user, dict(calls, tool_calls=[{"name": "add"}])]})], [], 2,
         "bad.jsonl:2: messages[1].tool_calls[0].function must be an object"),
        ([good, called(function={"name": 5, "arguments": {}})], [], 2,
         "bad.jsonl:2: messages[1].tool_calls[0].function.name must be a string"),
        ([good, line({"messages": [user, answer], "tools": "[]"})], [], 2,
         'bad.jsonl:2: "tools" must be a list of tool definitions'),
        ([good, line({"messages": [user, answer], "tools": [tools[0], "add"]})], [], 2,
         "bad.jsonl:2: tools[1] must be an object (a function schema), got a string"),
        ([good, line({"messages": [user, dict(answer, content=None)]})], [], 2,
         "bad.jsonl:2: messages[1].content must be a string, got null"),
        ([good, line({"messages": [user, {"role": "function", "content": "3"}, answer]})], [], 2,
         'bad.jsonl:2: messages[1].role: "function" is not a role the qwen2.5 chat template'),
        ([good, line({"messages": [user, answer],
                      "chat_template_kwargs": {"enable_thinking": False}})], [], 2,
         'bad.jsonl:2: "chat_template_kwargs"'),
        ([good, line({"messages": [user, dict(answer, tool_calls=None)]}),
          line({"messages": [user, dict(answer, tool_calls=[])]})], [], 0, ""),
    ]
