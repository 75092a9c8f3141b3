#!/usr/bin/env python3
"""The Parquet and Arrow stream reader (src/data/formats/arrow_rows.h) against pyarrow.

  parquet_check.py ARROW_ROWS_TOOL              the checks (exit 0; 77 without datasets/pyarrow)
  parquet_check.py ARROW_ROWS_TOOL --bench [GB] read generated GB-sized Parquet files (default
                                                1.0; text rows, then MLPerf-style token rows) with
                                                the reader and with pyarrow; print rows/s and RSS
                                                growth (<= 200 MB for the reader); the files are
                                                deleted afterwards

Files written here by datasets 5 (Dataset.to_parquet with several row groups, save_to_disk in
two shards: Arrow IPC streams) and by pyarrow (a stream of small batches; a table of the types
the reader converts): chat records (messages: lists of {role, content, reasoning_content} with
nulls), Alpaca records (instruction, input, output; empty and null inputs), token rows
(input_ids int32, labels with -100 on the prompt, attention_mask int8).

- Rows: every file's row count and rows equal pyarrow's (Table.to_pylist; dates as ISO text).
- Seek: from row k (0, row-group and batch boundaries and their neighbours, the last row, the
  end) the rows read equal pyarrow's rows k...; a column subset reads those columns only.
- Token rows read without JSON (next_integer_lists) equal pyarrow's; a null list or item, or a
  column of strings: exit 2 naming file, row and column.
- Types: require() accepts a column of its kind and refuses another type naming file and column.
- Bad input, exit 2 and one line naming the file: truncated Parquet, a file that is not Parquet,
  Feather v1 and v2 (Arrow IPC file format) named as such, a truncated Arrow stream, a missing
  column (the file's columns listed), a folder, an empty file; corrupt Parquet data: exit 0 or
  2, never a crash.
"""
import base64
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    import datasets
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

TOOL = sys.argv[1] if len(sys.argv) > 1 else sys.exit(__doc__)
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def tool(path, *args):
    p = subprocess.run([TOOL, path, *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def tool_rows(path, *args):
    rc, out, err = tool(path, *args)
    if rc != 0:
        raise RuntimeError(f"{path} {args}: rc {rc}: {err}")
    lines = out.splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def plain(value):
    """pyarrow's Python values as the reader's JSON: dates as ISO text."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def read_table(path):
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"PAR1":
        return pq.read_table(path)
    with pa.OSFile(path, "rb") as f:
        return pa.ipc.open_stream(f).read_all()


def unit_starts(path):
    """The first row of each Parquet row group or Arrow stream batch."""
    starts = [0]
    if open(path, "rb").read(4) == b"PAR1":
        md = pq.ParquetFile(path).metadata
        for g in range(md.num_row_groups):
            starts.append(starts[-1] + md.row_group(g).num_rows)
    else:
        with pa.OSFile(path, "rb") as f:
            for b in pa.ipc.open_stream(f):
                starts.append(starts[-1] + b.num_rows)
    return starts


WORDS = ["héllo", "日本語", "naïve", "tab\there", 'quote "q"', "line\nbreak", "🙂", "", "end"]


def text(rng, n=None):
    return " ".join(rng.choice(WORDS) for _ in range(n if n is not None else rng.randint(0, 12)))


def chat_records(rng, n):
    out = []
    for i in range(n):
        messages = []
        if i % 3 == 0:
            messages.append({"role": "system", "content": text(rng)})
        for _ in range(rng.randint(1, 3)):
            messages.append({"role": "user", "content": text(rng)})
            reasoning = text(rng) if rng.random() < 0.3 else None
            messages.append({"role": "assistant", "content": text(rng), "reasoning_content": reasoning})
        out.append({"messages": messages, "source": f"row{i}"})
    return out


def alpaca_records(rng, n):
    inputs = ["", None, "some input", "日本語の入力"]
    return [{"instruction": text(rng, 5), "input": rng.choice(inputs), "output": text(rng)}
            for _ in range(n)]


def token_rows(rng, n):
    rows = []
    for _ in range(n):
        length = rng.randint(1, 300)
        prompt = rng.randint(0, length)
        ids = [rng.randrange(0, 128256) for _ in range(length)]
        labels = [-100] * prompt + ids[prompt:]
        rows.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * length})
    return rows


TOKEN_FEATURES = datasets.Features({
    "input_ids": datasets.List(datasets.Value("int32")),
    "labels": datasets.List(datasets.Value("int32")),
    "attention_mask": datasets.List(datasets.Value("int8")),
})


def write_files(d, rng):
    files = {}
    sets = {
        "chat": datasets.Dataset.from_list(chat_records(rng, 150)),
        "alpaca": datasets.Dataset.from_list(alpaca_records(rng, 120)),
        "tokens": datasets.Dataset.from_list(token_rows(rng, 90), features=TOKEN_FEATURES),
    }
    for name, ds in sets.items():
        files[f"{name}.parquet"] = os.path.join(d, f"{name}.parquet")
        ds.to_parquet(files[f"{name}.parquet"], batch_size=40)
        ds.save_to_disk(os.path.join(d, f"{name}_disk"), num_shards=2)
        for shard in sorted(os.listdir(os.path.join(d, f"{name}_disk"))):
            if shard.endswith(".arrow"):
                files[f"{name}_disk/{shard}"] = os.path.join(d, f"{name}_disk", shard)
    # A stream of many small batches, and a table of the other types the reader converts.
    tokens = sets["tokens"].data.table
    files["tokens_stream.arrow"] = os.path.join(d, "tokens_stream.arrow")
    with pa.OSFile(files["tokens_stream.arrow"], "wb") as f:
        with pa.ipc.new_stream(f, tokens.schema) as w:
            for b in tokens.to_batches(max_chunksize=17):
                w.write_batch(b)
    import datetime
    misc = pa.table({
        "id": pa.array(range(50), pa.int64()),
        "u8": pa.array([i % 256 for i in range(50)], pa.uint8()),
        "score": pa.array([rng.random() if i % 7 else None for i in range(50)], pa.float64()),
        "f32": pa.array([i / 3 for i in range(50)], pa.float32()),
        "flag": pa.array([i % 2 == 0 for i in range(50)]),
        "large": pa.array([text(rng) for _ in range(50)], pa.large_string()),
        "nested": pa.array([[[i, i + 1], [], None] for i in range(50)], pa.list_(pa.list_(pa.int64()))),
        "point": pa.array([{"x": i, "label": str(i)} for i in range(50)]),
        "day": pa.array([datetime.date(2024, 1, 1 + i % 28) for i in range(50)]),
        "nothing": pa.nulls(50),
    })
    files["misc.parquet"] = os.path.join(d, "misc.parquet")
    pq.write_table(misc, files["misc.parquet"], row_group_size=16)
    files["misc.arrow"] = os.path.join(d, "misc.arrow")
    with pa.OSFile(files["misc.arrow"], "wb") as f:
        with pa.ipc.new_stream(f, misc.schema) as w:
            w.write_table(misc, max_chunksize=11)
    return files


def check_rows(files):
    for name, path in files.items():
        table = read_table(path)
        expected = plain(table.to_pylist())
        header, rows = tool_rows(path)
        check(header["rows"] == table.num_rows, f"{name}: {header['rows']} rows, pyarrow {table.num_rows}")
        check(header["columns"] == table.column_names, f"{name}: columns {header['columns']}")
        check(rows == expected, f"{name}: rows differ from pyarrow's" +
              next((f" (first at row {i})" for i, (a, b) in enumerate(zip(rows, expected)) if a != b), ""))
        starts = unit_starts(path)
        n = table.num_rows
        # Seeks in one reader, forwards and back: row 0, row-group and batch boundaries and their
        # neighbours, the last row, the end.
        froms = sorted({0, 1, n - 1, n} | {s + k for s in starts[1:-1] for k in (-1, 0, 1)})
        froms = [k for k in froms if 0 <= k <= n]
        froms += froms[::-1]
        _, got = tool_rows(path, "--seeks", ",".join(map(str, froms)), "--count", "5")
        want = []
        for k in froms:
            want += [{"seek": k}] + expected[k:k + 5]
        check(got == want, f"{name}: rows after seeks differ" +
              next((f" (first at output line {i}: {str(a)[:120]} != {str(b)[:120]})"
                    for i, (a, b) in enumerate(zip(got, want)) if a != b), ""))
        if len(starts) <= 2 and name.endswith(".parquet"):
            failures.append(f"{name}: one row group only; the seek checks need several")
    print(f"rows and seeks: {len(files)} files")


def check_columns(files):
    cases = [("tokens.parquet", ["labels", "input_ids"]), ("tokens_disk/data-00001-of-00002.arrow", ["labels"]),
             ("chat.parquet", ["messages"]), ("misc.arrow", ["point", "id"])]
    for name, cols in cases:
        expected = [{c: r[c] for c in cols} for r in plain(read_table(files[name]).to_pylist())]
        header, rows = tool_rows(files[name], "--columns", ",".join(cols))
        check(header["columns"] == cols, f"{name}: columns read {header['columns']}")
        check(rows == expected, f"{name}: rows of {cols} differ")
    # Token rows without JSON (next_integer_lists).
    for name in ("tokens.parquet", "tokens_stream.arrow", "tokens_disk/data-00000-of-00002.arrow"):
        expected = plain(read_table(files[name]).to_pylist())
        _, rows = tool_rows(files[name], "--integers")
        check(rows == expected, f"{name}: integer lists differ from pyarrow's")
        _, rows = tool_rows(files[name], "--integers", "--from", "41", "--columns", "labels")
        check(rows == [{"labels": r["labels"]} for r in expected[41:]], f"{name}: labels from 41 differ")
    rc, _, err = tool(files["chat.parquet"], "--integers", "--columns", "source,messages")
    one_line_error(rc, err, files["chat.parquet"], ["row 0", 'column "source"', "not a list of integers"],
                   "--integers on strings")
    holes = pa.table({"input_ids": pa.array([[1, 2], [3], None, [4, None]], pa.list_(pa.int32()))})
    path = os.path.join(os.path.dirname(files["misc.parquet"]), "holes.parquet")
    pq.write_table(holes, path)
    rc, _, err = tool(path, "--integers", "--from", "2", "--count", "1")
    one_line_error(rc, err, path, ["row 2", 'column "input_ids"', "null"], "a null token row")
    rc, _, err = tool(path, "--integers", "--from", "3")
    one_line_error(rc, err, path, ["row 3", 'column "input_ids"', "item 1 is null"], "a null token")
    good = [("tokens.parquet", "input_ids:integer_list"), ("tokens.parquet", "labels:list"),
            ("chat_disk/data-00000-of-00002.arrow", "messages:struct_list"),
            ("alpaca.parquet", "instruction:string"), ("misc.parquet", "id:integer")]
    for name, req in good:
        rc, _, err = tool(files[name], "--require", req, "--count", "1")
        check(rc == 0, f"{name} --require {req}: rc {rc} {err}")
    bad = [("tokens.parquet", "input_ids:string", "expected a string"),
           ("chat.parquet", "messages:integer_list", "expected a list of integers"),
           ("alpaca_disk/data-00000-of-00002.arrow", "output:integer", "expected an integer"),
           ("misc.parquet", "nested:integer_list", "expected a list of integers")]
    for name, req, phrase in bad:
        rc, _, err = tool(files[name], "--require", req)
        column = req.split(":")[0]
        one_line_error(rc, err, files[name], [phrase, f'column "{column}"'], f"--require {req}")


def one_line_error(rc, err, path, phrases, what):
    lines = err.strip().splitlines()
    check(rc == 2, f"{what}: rc {rc}, expected 2 ({err.strip()})")
    check(len(lines) == 1, f"{what}: {len(lines)} lines of error: {err!r}")
    check(path in err, f"{what}: the error does not name {path}: {err.strip()}")
    for p in phrases:
        check(p in err, f"{what}: the error lacks '{p}': {err.strip()}")
    print(f"  {what}: {err.strip()}")


def check_bad(files, d):
    bad = {}
    data = open(files["chat.parquet"], "rb").read()
    bad["truncated.parquet"] = (data[: len(data) // 2], ["not a Parquet file, or truncated"])
    bad["lines.parquet"] = (b'{"messages": []}\n', ["not a Parquet file"])
    stream = open(files["tokens_stream.arrow"], "rb").read()
    bad["truncated.arrow"] = (stream[: len(stream) * 2 // 3], ["truncated or corrupt Arrow stream", "rows from"])
    bad["empty.arrow"] = (b"", ["empty file"])
    bad["text.arrow"] = (b"hello world\n", ["neither Parquet nor an Arrow IPC stream"])
    for name, (content, phrases) in bad.items():
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(content)
        rc, _, err = tool(path)
        one_line_error(rc, err, path, phrases, name)
    table = read_table(files["chat.parquet"])
    for version, phrase in ((2, "an Arrow IPC file (Feather v2)"), (1, "Feather v1")):
        path = os.path.join(d, f"feather{version}.arrow")
        warnings.simplefilter("ignore", DeprecationWarning)  # Feather v1, as old files are
        feather.write_feather(table if version == 2 else table.select(["source"]).combine_chunks(),
                              path, version=version)
        rc, _, err = tool(path)
        one_line_error(rc, err, path, [phrase, "stream"], f"feather v{version}")
    rc, _, err = tool(files["chat.parquet"], "--columns", "messages,conversations")
    one_line_error(rc, err, files["chat.parquet"], ['no column "conversations"', "messages, source"],
                   "missing column")
    rc, _, err = tool(os.path.join(d, "chat_disk"))
    one_line_error(rc, err, os.path.join(d, "chat_disk"), ["a folder", "data-*.arrow"], "folder")
    rc, _, err = tool(os.path.join(d, "none.parquet"))
    one_line_error(rc, err, os.path.join(d, "none.parquet"), ["no such file"], "missing file")
    # Bytes overwritten in the middle of the data pages (the footer intact): read or refused.
    corrupt = bytearray(data)
    for i in range(len(corrupt) // 3, len(corrupt) // 3 + 64):
        corrupt[i] ^= 0x5A
    path = os.path.join(d, "corrupt.parquet")
    open(path, "wb").write(bytes(corrupt))
    rc, _, err = tool(path)
    check(rc in (0, 2), f"corrupt.parquet: rc {rc} (a crash?): {err[-300:]}")
    if rc == 2:
        one_line_error(rc, err, path, [], "corrupt.parquet")


def write_text_file(path, gb):
    """Rows of 2,048 B of base64 text (incompressible), row groups of 128 MB."""
    rng = random.Random(0)
    rows_per_group, row_bytes = 65536, 2048
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    with pq.ParquetWriter(path, schema) as w:
        for g in range(max(1, int(gb * 2**30 / (rows_per_group * row_bytes)))):
            enc = base64.b64encode(rng.randbytes(rows_per_group * row_bytes * 3 // 4)).decode()
            texts = [enc[i * row_bytes:(i + 1) * row_bytes] for i in range(rows_per_group)]
            ids = range(g * rows_per_group, (g + 1) * rows_per_group)
            w.write_table(pa.table({"id": pa.array(ids, pa.int64()), "text": texts}, schema=schema))
    return "2,048 B of text"


def write_token_file(path, gb):
    """MLPerf-style rows: 8,192 input_ids (int32) and labels, -100 on a prompt of random length;
    row groups of 2,048 rows until the file holds GB (ids drawn from 32,000: dictionary-encoded)."""
    import numpy as np
    rng = np.random.default_rng(0)
    seq, rows_per_group = 8192, 2048
    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32()))])
    offsets = pa.array(np.arange(0, (rows_per_group + 1) * seq, seq, dtype=np.int32))
    with pq.ParquetWriter(path, schema) as w:
        while os.path.getsize(path) < gb * 1e9:
            ids = rng.integers(0, 32000, size=rows_per_group * seq, dtype=np.int32)
            labels = ids.copy().reshape(rows_per_group, seq)
            prompt = rng.integers(0, seq, size=rows_per_group)
            labels[np.arange(seq)[None, :] < prompt[:, None]] = -100
            w.write_table(pa.table({
                "input_ids": pa.ListArray.from_arrays(offsets, pa.array(ids)),
                "labels": pa.ListArray.from_arrays(offsets, pa.array(labels.reshape(-1)))},
                schema=schema))
    return f"{seq} input_ids and labels"


def bench(gb, kind):
    d = tempfile.mkdtemp(prefix="arrow_rows_bench_", dir="/tmp")
    path = os.path.join(d, f"{kind}.parquet")
    try:
        t0 = time.time()
        what = (write_text_file if kind == "text" else write_token_file)(path, gb)
        md = pq.ParquetFile(path).metadata
        print(f"bench file ({kind}): {os.path.getsize(path) / 1e9:.2f} GB, {md.num_rows} rows of "
              f"{what}, {md.num_row_groups} row groups ({time.time() - t0:.0f} s to write)")
        results = {}
        modes = {"reader": []} if kind == "text" else {"reader": [], "reader-integers": ["--integers"]}
        for _ in range(2 if kind == "text" else 1):  # the best of two: the machine may be busy
            for mode, flags in modes.items():
                rc, out, err = tool(path, "--stats", *flags)
                if rc != 0:
                    raise RuntimeError(err)
                stats = json.loads(out.splitlines()[-1])
                check(stats["read"] == md.num_rows, f"bench: read {stats['read']} of {md.num_rows}")
                results.setdefault(mode, []).append(stats)
            for mode in PYARROW_MODES:
                p = subprocess.run([sys.executable, __file__, "--pyarrow-read", path, mode],
                                   capture_output=True, text=True, check=True)
                results.setdefault(mode, []).append(json.loads(p.stdout.splitlines()[-1]))
        best = {k: max(v, key=lambda s: s["rows_per_s"]) for k, v in results.items()}
        for mode, label in (("reader", "next (JSON rows)"), ("reader-integers", "next_integer_lists")):
            if mode in best:
                r = best[mode]
                print(f"reader {label}: {r['rows_per_s']:.0f} rows/s, {r['seconds']:.2f} s, "
                      f"RSS {r['rss_start_mb']:.0f} -> peak {r['rss_peak_mb']:.0f} MB "
                      f"(growth {r['rss_peak_mb'] - r['rss_start_mb']:.0f} MB)")
                check(r["rss_peak_mb"] - r["rss_start_mb"] <= 200, f"bench: {mode}: RSS growth above 200 MB")
        for mode, label in PYARROW_MODES.items():
            s = best[mode]
            print(f"pyarrow {label}: {s['rows_per_s']:.0f} rows/s, {s['seconds']:.2f} s, RSS growth "
                  f"{s['rss_peak_mb'] - s['rss_start_mb']:.0f} MB")
    finally:
        shutil.rmtree(d)


PYARROW_MODES = {
    "decode": "iter_batches, defaults (Arrow arrays)",
    "pylist": "iter_batches + to_pylist, defaults (Python rows)",
    "decode-buffered": "iter_batches, buffer_size 1 MB, pre_buffer off (Arrow arrays)",
    "pylist-buffered": "iter_batches + to_pylist, buffer_size 1 MB, pre_buffer off (Python rows)",
}


def pyarrow_read(path, mode):
    """A child process: read `path` with pyarrow in batches of the reader's size (about 4 MB)."""
    def status_mb(key):  # VmHWM, not ru_maxrss: that one keeps the parent's peak across exec
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    start = status_mb("VmRSS")
    t0 = time.time()
    n = 0
    buffered = mode.endswith("-buffered")
    f = pq.ParquetFile(path, buffer_size=1 << 20 if buffered else 0, pre_buffer=not buffered)
    batch_rows = max(1, min(4096, (4 << 20) * f.metadata.num_rows //
                            max(1, sum(f.metadata.row_group(g).total_byte_size
                                       for g in range(f.metadata.num_row_groups)))))
    for batch in f.iter_batches(batch_size=batch_rows):
        if mode.startswith("pylist"):
            rows = batch.to_pylist()
            n += len(rows)
        else:
            n += batch.num_rows
    seconds = time.time() - t0
    peak = status_mb("VmHWM")
    print(json.dumps({"read": n, "seconds": seconds, "rows_per_s": n / seconds,
                      "rss_start_mb": start, "rss_peak_mb": peak}))


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "--pyarrow-read":
        pyarrow_read(sys.argv[2], sys.argv[3])
        return
    if "--bench" in sys.argv:
        i = sys.argv.index("--bench")
        gb = float(sys.argv[i + 1]) if len(sys.argv) > i + 1 else 1.0
        for kind in ("text", "tokens"):
            bench(gb, kind)
    else:
        with tempfile.TemporaryDirectory() as d:
            files = write_files(d, random.Random(1))
            check_rows(files)
            check_columns(files)
            check_bad(files, d)
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
