"""docs/reference.md's config-key table lists exactly the keys the trainer has.

Usage: reference_check.py TRAINER_BINARY REFERENCE_MD

The trainer's keys are those of `trainer --print-config`, which prints every key of every section
and of every registered model, data set and optimizer whichever is selected, flattened to dotted
paths (a list is one value). The documented keys are the first cells of the table headed
`| key | default | meaning |`, each a backticked dotted path. Exits 1 naming the keys missing from
the table and the documented keys the trainer does not have; 77 (skipped) when PyYAML is not
installed.
"""
import os
import re
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("PyYAML is not installed in this Python; skipping")
    sys.exit(77)

KEY = re.compile(r"^`([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)`$")


def trainer_keys(trainer):
    """The dotted keys of the resolved config, from --print-config on a one-line config."""
    trainer = os.path.abspath(trainer)
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "reference.yaml")
        with open(config, "w") as f:
            f.write("seed: 0\n")
        r = subprocess.run([trainer, "--print-config", "--config", config], cwd=tmp,
                           capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"{trainer} --print-config exited {r.returncode}:\n{r.stderr}")
    # BaseLoader: every key stays the string it is in the file (no YAML 1.1 booleans).
    resolved = yaml.load(r.stdout, Loader=yaml.BaseLoader)
    if not isinstance(resolved, dict) or not resolved:
        raise SystemExit(f"{trainer} --print-config printed no mapping:\n{r.stdout}")
    keys = []

    def flatten(node, prefix):
        for name, value in node.items():
            path = prefix + name
            if isinstance(value, dict) and value:
                flatten(value, path + ".")
            else:
                keys.append(path)

    flatten(resolved, "")
    return keys


def cells(line):
    """The cells of a markdown table row, or None when the line is not one."""
    line = line.strip()
    if not line.startswith("|"):
        return None
    return [c.strip() for c in line.strip("|").split("|")]


def documented_keys(path):
    """The keys of the config-key table, with the line of each; problems in the table."""
    keys, problems = {}, []
    lines = open(path, encoding="utf-8").read().splitlines()
    headers = [i for i, line in enumerate(lines) if cells(line) == ["key", "default", "meaning"]]
    if len(headers) != 1:
        problems.append(f"{path}: expected one table headed '| key | default | meaning |', "
                        f"found {len(headers)}")
        return keys, problems
    for n in range(headers[0] + 2, len(lines)):  # after the header and its --- row
        row = cells(lines[n])
        if row is None:
            break
        m = KEY.match(row[0])
        if not m:
            problems.append(f"{path}:{n + 1}: the first cell is not a backticked key: {row[0]}")
            continue
        if len(row) < 3 or not row[1] or not row[2]:
            problems.append(f"{path}:{n + 1}: {m.group(1)}: no default or no meaning")
        if m.group(1) in keys:
            problems.append(f"{path}:{n + 1}: {m.group(1)} is documented twice (first on line "
                            f"{keys[m.group(1)]})")
        keys.setdefault(m.group(1), n + 1)
    return keys, problems


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    trainer, reference = sys.argv[1], sys.argv[2]
    have = trainer_keys(trainer)
    documented, problems = documented_keys(reference)
    missing = [k for k in have if k not in documented]
    extra = [k for k in documented if k not in set(have)]
    if missing:
        problems.append(f"{len(missing)} key(s) of the trainer missing from {reference}'s "
                        "config-key table:\n  " + "\n  ".join(missing))
    if extra:
        problems.append(f"{len(extra)} key(s) documented in {reference} that the trainer does "
                        "not have:\n  " +
                        "\n  ".join(f"{k} (line {documented[k]})" for k in extra))
    if problems:
        print("FAIL\n" + "\n".join(problems))
        return 1
    print(f"OK: {reference} documents all {len(have)} config keys of {trainer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
