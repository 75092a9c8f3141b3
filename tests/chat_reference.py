"""What the chat checks share: transformers' tokenizer for a tokenizer.json and the settings of a
tokenizer_config.json, the reference the trainer's chat templates are compared with; chat_tool's
jobs run in one process."""
import atexit
import json
import os
import subprocess


_loaded = {}  # vocab_json -> the tokenizer hf_tokenizer returned for it last


def hf_tokenizer(vocab_json, config):
    """transformers' fast tokenizer over `vocab_json` with `config`'s bos/eos tokens and chat
    template (transformers is imported by the caller, which skips without it).

    Each vocabulary is read once (Llama 3's tokenizer.json takes over a second): a later call with
    the same `vocab_json` sets `config`'s tokens and template on the same object and returns it,
    so a caller uses only the tokenizer of its last call for that file. Setting them equals
    passing them to the constructor (the same ids, renders and special tokens map)."""
    import transformers

    t = _loaded.get(vocab_json)
    if t is None:
        t = transformers.PreTrainedTokenizerFast(tokenizer_file=vocab_json)
        _loaded[vocab_json] = t
    t.bos_token = config.get("bos_token")
    t.eos_token = config.get("eos_token")
    t.chat_template = config.get("chat_template")
    return t


_served = {}  # chat_tool -> its `chat_tool --serve` process


def run_tool(chat_tool, out, settings):
    """(exit status, stderr) of one chat_tool job, run by a `chat_tool --serve` process that runs
    every job of the calling check (one LibTorch start instead of one a job); a new one after a crash."""
    p = _served.get(chat_tool)
    if p is None or p.poll() is not None:
        p = _served[chat_tool] = subprocess.Popen([chat_tool, "--serve"], stdin=subprocess.PIPE,
                                                  stdout=subprocess.PIPE, text=True)
        atexit.register(lambda: (p.stdin.close(), p.wait()))  # ends at the end of its input
    p.stdin.write(json.dumps([out, *settings]) + "\n")
    p.stdin.flush()
    reply = p.stdout.readline()
    with open(os.path.join(out, "stderr.txt"), encoding="utf-8", errors="replace") as f:
        err = f.read()
    if not reply:  # the job ended the process: its signal as subprocess reports it
        return p.wait(), err
    return int(reply), err
