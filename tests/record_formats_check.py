#!/usr/bin/env python3
"""Alpaca and ShareGPT chat records (data.format, text/chat/record_formats.h) against a reference
that converts them to messages with LLaMA-Factory's rules and renders them with transformers'
apply_chat_template (CTest Chat.RecordFormatsMatchLlamaFactory).

  record_formats_check.py CHAT_TOOL RECORD_FORMATS_TOOL TRAINER

The reference conversion is written here from LLaMA-Factory's documentation (data/README.md) and
converters (src/llamafactory/data/converter.py, AlpacaDatasetConverter and
SharegptDatasetConverter):
- Alpaca: the history's [user, assistant] pairs, then a user turn of `instruction` and `input`
  joined by "\\n" (each only where non-empty), then `output` as the assistant turn (the response);
  `system`, where non-empty, as the system prompt.
- ShareGPT: `conversations` of {from, value}, human -> user, gpt -> assistant, observation -> a
  tool result, function_call -> a tool call (its value JSON {"name", "arguments"}); a first
  system message is the system prompt, else the record's `system`; an empty system prompt is none.
- dataset_info's "columns" and "tags" rename the columns and role names.
LLaMA-Factory drops ShareGPT records whose roles do not alternate user/assistant; trainer renders
them as they are (documented), and so does the reference here.

Checks, over the Llama 3.1 Instruct and Qwen 3 templates (tests/data/chat_templates/) on Llama 3's
and Qwen 3's vocabularies (chat_check.py's): 200 Alpaca and 200 ShareGPT records, adversarial ones
among them (empty instruction or input, input missing or null, empty and missing system,
histories, system messages later in a conversation, a conversation ending on a user turn), read
with data.format auto and named, ids and trained masks (train_on assistant; Alpaca: completion
too, the response) equal to the reference; records in other column and role names read with the
mapping keys equal the reference with LLaMA-Factory's columns and tags; a file mixing the four
formats read with auto. ShareGPT tool calls and tool results and a record's tools rewritten as
OpenAI's tool_calls, tool messages and tools (record_formats_tool: the record the parser reads),
and their ids equal apply_chat_template(messages, tools=tools) where the chat templates render
tool calls. Bad input, each exit 2 with one line naming the file and line: a record of no format,
a named column missing, a role name of none of the roles, a malformed history, a record of
another format than data.format; settings that name a role twice or an empty role, or
data.messages_key under format auto: exit 2 naming the key (record_formats_tool, and the trainer
at start naming config.yaml's line).
Exits 77 (skipped) when transformers, tokenizers or quicktok is not installed.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import chat_check as cc  # noqa: E402  (exits 77 without transformers, tokenizers, quicktok)
from chat_check import fail, failures  # noqa: E402
from chat_reference import hf_tokenizer  # noqa: E402

TEMPLATES = {"llama3.1-instruct": "llama3", "qwen3": "qwen3"}

# LLaMA-Factory's default columns and tags, and the names of the mapped copies.
ALPACA = {"prompt": "instruction", "query": "input", "response": "output", "system": "system",
          "history": "history"}
ALPACA_MAPPED = {"prompt": "question", "query": "context", "response": "answer",
                 "system": "preamble", "history": "turns"}
SHAREGPT = {"messages": "conversations", "system": "system", "role_tag": "from",
            "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
            "observation_tag": "observation", "function_tag": "function_call",
            "system_tag": "system"}
SHAREGPT_MAPPED = {"messages": "dialog", "system": "sys", "role_tag": "speaker",
                   "content_tag": "text", "user_tag": "USER", "assistant_tag": "BOT",
                   "observation_tag": "RESULT", "function_tag": "CALL", "system_tag": "SYSTEM"}
SHAREGPT_MAPPED_SETTINGS = ["format=sharegpt", "messages_key=dialog", "system_key=sys",
                            "role_key=speaker", "content_key=text", "user_role=USER",
                            "assistant_role=BOT", "tool_role=RESULT", "tool_call_role=CALL",
                            "system_role=SYSTEM"]
ALPACA_MAPPED_SETTINGS = ["instruction_key=question", "input_key=context", "output_key=answer",
                          "system_key=preamble", "history_key=turns"]


# ---- the reference: LLaMA-Factory's rules -----------------------------------------------------

def alpaca_reference(rec, cols=ALPACA):
    """{"prompt", "completion"} messages of an Alpaca record (AlpacaDatasetConverter)."""
    prompt = []
    if rec.get(cols["system"]):
        prompt.append({"role": "system", "content": rec[cols["system"]]})
    if isinstance(rec.get(cols["history"]), list):
        for old_prompt, old_response in rec[cols["history"]]:
            prompt.append({"role": "user", "content": old_prompt})
            prompt.append({"role": "assistant", "content": old_response})
    query = [rec[c] for c in (cols["prompt"], cols["query"]) if rec.get(c)]
    prompt.append({"role": "user", "content": "\n".join(query)})
    answer = {"role": "assistant", "content": rec[cols["response"]]}
    return {"prompt": prompt, "completion": [answer]}


def tool_calls(value):
    calls = json.loads(value)
    calls = calls if isinstance(calls, list) else [calls]
    return [{"type": "function",
             "function": {"name": c["name"], "arguments": c.get("arguments", {})}} for c in calls]


def sharegpt_reference(rec, tags=SHAREGPT):
    """{"messages", "tools"?} of a ShareGPT record (SharegptDatasetConverter), tool calls and
    results in OpenAI's form."""
    role, content = tags["role_tag"], tags["content_tag"]
    messages = rec[tags["messages"]]
    if messages and messages[0][role] == tags["system_tag"]:
        system, messages = messages[0][content], messages[1:]
    else:
        system = rec.get(tags["system"]) or ""
    out = [{"role": "system", "content": system}] if system else []
    names = {tags["user_tag"]: "user", tags["assistant_tag"]: "assistant",
             tags["system_tag"]: "system", tags["observation_tag"]: "tool"}
    for m in messages:
        if m[role] == tags["function_tag"]:
            out.append({"role": "assistant", "content": "", "tool_calls": tool_calls(m[content])})
        else:
            out.append({"role": names[m[role]], "content": m[content]})
    record = {"messages": out}
    tools = rec.get("tools")
    if tools:
        tools = json.loads(tools) if isinstance(tools, str) else tools
        if tools:
            record["tools"] = [t if "type" in t else {"type": "function", "function": t}
                               for t in tools]
    return record


def messages_reference(rec, tags=SHAREGPT_MAPPED):
    """OpenAI messages under the names of `tags` (data.format messages with the mapping keys):
    renamed back, nothing else changed; the record's system prompt, where non-empty, first when
    the messages do not start with a system message (trainer's rule, documented)."""
    role, content = tags["role_tag"], tags["content_tag"]
    names = {tags["user_tag"]: "user", tags["assistant_tag"]: "assistant",
             tags["system_tag"]: "system", tags["observation_tag"]: "tool"}
    out = [{"role": names[m[role]], "content": m[content]} for m in rec[tags["messages"]]]
    if (not out or out[0]["role"] != "system") and rec.get(tags["system"]):
        out.insert(0, {"role": "system", "content": rec[tags["system"]]})
    return {"messages": out}


# ---- records made here ----------------------------------------------------------------------

def maybe_text(rng):
    return rng.choice(["", cc.text(rng), cc.text(rng), cc.text(rng)])


def alpaca_record(rng):
    rec = {"instruction": maybe_text(rng), "output": rng.choice([cc.text(rng)] * 9 + [""])}
    r = rng.random()
    if r < 0.6:
        rec["input"] = maybe_text(rng)
    elif r < 0.7:
        rec["input"] = None
    if rng.random() < 0.5:
        rec["system"] = maybe_text(rng)
    if rng.random() < 0.4:
        rec["history"] = [[cc.text(rng), cc.text(rng)] for _ in range(rng.randint(0, 3))]
    if not rec["instruction"] and not rec.get("input") and rng.random() < 0.5:
        rec["instruction"] = cc.text(rng)
    return rec


def sharegpt_record(rng, tags=SHAREGPT):
    role, content = tags["role_tag"], tags["content_tag"]
    msgs = []
    r = rng.random()
    if r < 0.3:
        msgs.append({role: tags["system_tag"], content: maybe_text(rng)})
    rec = {}
    if rng.random() < 0.4:
        rec[tags["system"]] = maybe_text(rng)
    for k in range(rng.randint(1, 4)):
        msgs.append({role: tags["user_tag"], content: cc.text(rng)})
        if rng.random() < 0.08:  # a system message later on (LLaMA-Factory: broken data)
            msgs.append({role: tags["system_tag"], content: cc.text(rng)})
        if k == 0 or rng.random() < 0.95:  # else a conversation ending on a user turn
            msgs.append({role: tags["assistant_tag"], content: cc.text(rng)})
    rec[tags["messages"]] = msgs
    return rec


def tool_record(rng, tags=SHAREGPT):
    role, content = tags["role_tag"], tags["content_tag"]
    call = {"name": "get_weather", "arguments": {"city": rng.choice(["Paris", "東京"])}}
    tools = [{"name": "get_weather", "description": "The weather in a city.",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}]
    return {tags["messages"]: [
        {role: tags["user_tag"], content: "What is the weather in Paris?"},
        {role: tags["function_tag"], content: json.dumps(call, ensure_ascii=False)},
        {role: tags["observation_tag"], content: '{"temperature": 21}'},
        {role: tags["assistant_tag"], content: "It is 21 degrees."}],
        "tools": json.dumps(tools) if rng.random() < 0.5 else tools}


def rename(rec, cols, to):
    return {to[k]: v for k, v in ((k, rec[cols[k]]) for k in cols if cols[k] in rec)}


def rename_sharegpt(rec):
    a, b = SHAREGPT, SHAREGPT_MAPPED
    roles = {a[k]: b[k] for k in ("user_tag", "assistant_tag", "observation_tag", "function_tag",
                                  "system_tag")}
    out = {b["messages"]: [{b["role_tag"]: roles[m[a["role_tag"]]],
                            b["content_tag"]: m[a["content_tag"]]} for m in rec[a["messages"]]]}
    if a["system"] in rec:
        out[b["system"]] = rec[a["system"]]
    if "tools" in rec:
        out["tools"] = rec["tools"]
    return out


# ---- checks ---------------------------------------------------------------------------------

def run(chat_tool, work, files, tokenizer, *settings, mode="assistant"):
    return cc.tool(chat_tool, os.path.join(work, "out"), f"root={work}", f"files={files}",
                   f"tokenizer={tokenizer}", f"train_on={mode}", "dump=conversations", *settings)


def check(chat_tool, work, what, name, records, tokenizer, t, settings, modes=("assistant",)):
    """The conversations of `name` (records: its reference messages) read with `settings`."""
    want = {f"{work}/{name}:{i + 1}": cc.reference(t, r) for i, r in enumerate(records)}
    for mode in modes:
        rc, err, got, _ = run(chat_tool, work, name, tokenizer, *settings, mode=mode)
        if rc != 0:
            fail(f"{what} train_on {mode}: exit {rc}: {err[-500:]}")
            continue
        cc.compare(f"{what} train_on {mode}", got, want, mode, err)


def check_templates(chat_tool, work, vocab, data):
    for tpl, voc in TEMPLATES.items():
        config = cc.template_file(tpl)
        d = cc.folder(work, "tpl-" + tpl, vocab[voc], config)
        t = hf_tokenizer(vocab[voc], config)
        alpaca = [alpaca_reference(r) for r in data["alpaca"]]
        sharegpt = [sharegpt_reference(r) for r in data["sharegpt"]]
        both = ("assistant", "completion")
        check(chat_tool, work, f"{tpl} alpaca auto", "alpaca.jsonl", alpaca, d, t, [], both)
        check(chat_tool, work, f"{tpl} alpaca", "alpaca.jsonl", alpaca, d, t, ["format=alpaca"])
        check(chat_tool, work, f"{tpl} sharegpt auto", "sharegpt.jsonl", sharegpt, d, t, [],
              ("assistant", "last"))
        check(chat_tool, work, f"{tpl} sharegpt", "sharegpt.jsonl", sharegpt, d, t,
              ["format=sharegpt"])
        if tpl != "qwen3":
            continue
        mapped = [alpaca_reference(r, ALPACA_MAPPED) for r in data["alpaca_mapped"]]
        check(chat_tool, work, f"{tpl} alpaca mapped", "alpaca_mapped.jsonl", mapped, d, t,
              ["format=alpaca"] + ALPACA_MAPPED_SETTINGS, both)
        check(chat_tool, work, f"{tpl} alpaca mapped, auto", "alpaca_mapped.jsonl", mapped, d, t,
              ALPACA_MAPPED_SETTINGS)
        mapped = [sharegpt_reference(r, SHAREGPT_MAPPED) for r in data["sharegpt_mapped"]]
        check(chat_tool, work, f"{tpl} sharegpt mapped", "sharegpt_mapped.jsonl", mapped, d, t,
              SHAREGPT_MAPPED_SETTINGS)
        # OpenAI messages under other names: format messages with the same keys.
        messages = [messages_reference(r) for r in data["sharegpt_mapped"]]
        settings = [s.replace("format=sharegpt", "format=messages") for s in
                    SHAREGPT_MAPPED_SETTINGS]
        check(chat_tool, work, f"{tpl} messages mapped", "sharegpt_mapped.jsonl", messages, d, t,
              settings)
        check(chat_tool, work, f"{tpl} mixed formats, auto", "mixed.jsonl", data["mixed_ref"], d,
              t, [])


def check_tools(chat_tool, rf_tool, work, vocab, records):
    """ShareGPT tool calls: the rewritten records equal the reference's OpenAI form; their ids
    equal apply_chat_template(messages, tools=tools) once the templates render tool calls."""
    path = os.path.join(work, "tools.jsonl")
    cc.write_jsonl(path, records)
    want = [sharegpt_reference(r) for r in records]
    out = subprocess.run([rf_tool, path], capture_output=True, text=True)
    got = [json.loads(line) for line in out.stdout.split("\n") if line]
    if out.returncode != 0 or [g.get("record") for g in got] != want:
        fail(f"tool records: rewritten {got[:1]}, want {want[:1]} ({out.stderr[-300:]})")
    else:
        print(f"tool records: {len(want)} rewritten as the reference's OpenAI messages and tools")
    mapped = os.path.join(work, "tools_mapped.jsonl")
    cc.write_jsonl(mapped, [rename_sharegpt(r) for r in records])
    out = subprocess.run([rf_tool, mapped] + SHAREGPT_MAPPED_SETTINGS, capture_output=True,
                         text=True)
    if [json.loads(line).get("record") for line in out.stdout.split("\n") if line] != want:
        fail(f"mapped tool records: {out.stdout[:300]} {out.stderr[-300:]}")
    for tpl, voc in TEMPLATES.items():
        config = cc.template_file(tpl)
        d = cc.folder(work, "tpl-" + tpl, vocab[voc], config)
        t = hf_tokenizer(vocab[voc], config)
        rc, err, got, _ = run(chat_tool, work, "tools.jsonl", d)
        if rc == 2 and "tools.jsonl:1:" in err and "tool" in err:
            print(f"{tpl} tool records: not rendered yet (exit 2: {err.strip()[-160:]})")
            continue
        w = {f"{path}:{i + 1}": cc.reference(t, r, tools=r.get("tools"))
             for i, r in enumerate(want)}
        if rc != 0:
            fail(f"{tpl} tool records: exit {rc}: {err[-300:]}")
            continue
        cc.compare(f"{tpl} tool records", got, w, "assistant", err)


def error_line(err, where):
    """The one line of `err` naming `where`, or None when there are none or several."""
    lines = [line for line in err.splitlines() if where in line]
    return lines[0] if len(lines) == 1 else None


def check_bad_input(chat_tool, rf_tool, trainer, work, tokenizer):
    good_alpaca = json.dumps({"instruction": "Add 1 and 1.", "input": "", "output": "2"})
    good_share = json.dumps({"conversations": [{"from": "human", "value": "hi"},
                                               {"from": "gpt", "value": "hello"}]})
    cases = [  # (lines, settings, the message's text after FILE:LINE)
        ([good_alpaca, good_share, '{"text": "a", "id": 1}'], [], 3,
         'the record\'s keys ("text", "id") are none of a chat format\'s'),
        ([good_alpaca, json.dumps({"instruction": "a", "response": "b"})], [], 2,
         'an Alpaca record needs "output"'),
        ([good_alpaca, good_alpaca.replace('"output"', '"answer"')], ["output_key=answer"], 1,
         'an Alpaca record needs "answer"'),
        ([good_share, json.dumps({"conversations": [{"from": "human", "value": "a"},
                                                    {"from": "bot", "value": "b"}]})], [], 2,
         'conversations[1].from is "bot", not a role of the records'),
        ([good_share, json.dumps({"conversations": [{"role": "user", "content": "a"}]})], [], 2,
         'conversations[0] has no "from" (data.role_key)'),
        ([good_share], ["format=sharegpt", "messages_key=dialog"], 1,
         'data.format is sharegpt and the record has no "dialog"'),
        ([good_share], ["format=alpaca"], 1, 'data.format is alpaca and the record has no '
                                             '"instruction"'),
        ([json.dumps({"instruction": "a", "output": "b", "history": [["only one"]]})], [], 1,
         "history[0] must be a pair [user, assistant] of strings"),
        ([json.dumps({"conversations": [{"from": "human", "value": 3}]})], [], 1,
         "conversations[0].value must be a string, got a number"),
        ([good_share, json.dumps({"conversations": [{"from": "human", "value": "a"},
                                                    {"from": "function_call", "value": "f("}]})],
         [], 2, "conversations[1].value must be a tool call"),
    ]
    bad = os.path.join(work, "bad.jsonl")
    for lines, settings, line, message in cases:
        with open(bad, "w") as f:
            f.write("\n".join(lines) + "\n")
        rc, err, _, _ = cc.tool(chat_tool, os.path.join(work, "out"), f"root={bad}",
                                f"tokenizer={tokenizer}", *settings)
        one = error_line(err, f"bad.jsonl:{line}: ")
        if rc != 2 or one is None or message not in one or "json.exception" in err:
            fail(f"bad input {message!r}: exit {rc}: {err[-400:]}")
    # Settings: a role name given to two roles, an empty name, messages_key under auto.
    for settings, message in ((["user_role=human", "assistant_role=gpt,human"],
                               'data.assistant_role: "human" is data.user_role\'s too'),
                              (["user_role=human,"], "data.user_role: an empty name"),
                              (["messages_key=dialog"], "data.messages_key: with data.format: "
                                                        "auto the list is recognised by its name")):
        out = subprocess.run([rf_tool, bad] + settings, capture_output=True, text=True)
        if out.returncode != 2 or message not in out.stderr:
            fail(f"settings {settings}: exit {out.returncode}: {out.stderr[-300:]}")
        # The trainer validates the chat data set's keys at start: config.yaml's line and column.
        config = os.path.join(work, "settings.yaml")
        with open(config, "w") as f:
            f.write("data: {name: chat, " + ", ".join(
                k + ": " + json.dumps(v) for k, v in (s.split("=", 1) for s in settings)) + "}\n")
        out = subprocess.run([trainer, "--print-config", "--config", config], capture_output=True,
                             text=True, cwd=work)
        lines = [line for line in out.stderr.splitlines() if message in line]
        if out.returncode != 2 or len(lines) != 1 or not lines[0].startswith(config + ":1:"):
            fail(f"trainer with {settings}: exit {out.returncode}: {out.stderr[-300:]}")
    print(f"bad input: {len(cases)} records and 3 settings, each exit 2 with one line naming it")


def main():
    chat_tool, rf_tool, trainer = sys.argv[1], sys.argv[2], sys.argv[3]
    rng = random.Random(20251207)
    data = {"alpaca": [alpaca_record(rng) for _ in range(200)],
            "sharegpt": [sharegpt_record(rng) for _ in range(200)]}
    data["alpaca_mapped"] = [rename(r, ALPACA, ALPACA_MAPPED) for r in data["alpaca"][:60]]
    data["sharegpt_mapped"] = [rename_sharegpt(r) for r in data["sharegpt"][:60]]
    mixed = []
    for i in range(40):
        kind = i % 4
        if kind == 0:
            mixed.append((data["alpaca"][i], alpaca_reference(data["alpaca"][i])))
        elif kind == 1:
            mixed.append((data["sharegpt"][i], sharegpt_reference(data["sharegpt"][i])))
        elif kind == 2:
            m = sharegpt_reference(data["sharegpt"][i])
            mixed.append((m, m))
        else:  # prompt/completion records read as such, whatever other columns they carry
            pc = cc.prompt_completion(rng)
            mixed.append(({**pc, "instruction": "x"} if i % 8 == 3 else pc, pc))
    data["mixed_ref"] = [ref for _, ref in mixed]
    with tempfile.TemporaryDirectory() as work:
        for name in ("alpaca", "sharegpt", "alpaca_mapped", "sharegpt_mapped"):
            cc.write_jsonl(os.path.join(work, name + ".jsonl"), data[name])
        cc.write_jsonl(os.path.join(work, "mixed.jsonl"), [rec for rec, _ in mixed])
        vocab = {v: cc.qj.write(v, os.path.join(work, "vocab-" + v)) for v in ("llama3", "qwen3")}
        check_templates(chat_tool, work, vocab, data)
        check_tools(chat_tool, rf_tool, work, vocab, [tool_record(rng) for _ in range(6)])
        qwen3 = cc.folder(work, "tpl-qwen3", vocab["qwen3"], cc.template_file("qwen3"))
        check_bad_input(chat_tool, rf_tool, trainer, work, qwen3)
    if failures:
        sys.exit(f"{len(failures)} failures; the first: {failures[0]}")
    print("record formats: all checks pass")


if __name__ == "__main__":
    main()
