#!/usr/bin/env python3
"""The size rules of docs/architecture.md (CTest Source.FilesAndFunctionsWithinTheirSizes):

  check_sizes.py [--max-file-lines N] [--max-function-lines N] ROOT

No C++ file under ROOT/src or ROOT/models is longer than N lines (600), and no function body
longer than N lines (60), from the line of its opening brace to the line of its closing one.
Bodies are found by matching braces after comments and string literals are blanked; a brace
opens a function body when it follows a closing parenthesis (a parameter list, possibly with
const, noexcept, override or a trailing return type between) at namespace or class scope.
Prints one line per breach, `path:line: what`, and exits 1 when there is any.
"""
import argparse
import pathlib
import re
import sys

STRING = re.compile(r'R"([^(]*)\((?:.|\n)*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
COMMENT = re.compile(r"//[^\n]*|/\*(?:.|\n)*?\*/")
# What may stand between a parameter list's ')' and the body's '{'.
AFTER_PARAMS = re.compile(r"\)\s*(?:const|noexcept|override|final|mutable|&|&&|->[^;{}]*|\s)*$")


def blank(text):
    """`text` with comments and string literals replaced by spaces, newlines kept."""
    def spaces(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    out, pos = [], 0
    pattern = re.compile(STRING.pattern + "|" + COMMENT.pattern)
    for m in pattern.finditer(text):
        out.append(text[pos:m.start()])
        out.append(spaces(m))
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def function_bodies(text):
    """(first line, last line) of every function body at namespace or class scope."""
    code = blank(text)
    stack = []  # (kind, line) per open brace: kind is "scope" (namespace, class) or "body"
    bodies = []
    line = 1
    for i, ch in enumerate(code):
        if ch == "\n":
            line += 1
        elif ch == "{":
            head = code[max(0, code.rfind(";", 0, i), code.rfind("}", 0, i),
                            code.rfind("{", 0, i)) + 1:i]
            at_scope = all(kind == "scope" for kind, _ in stack)
            if re.search(r"\b(namespace|class|struct|union|enum)\b[^()]*$", head) or \
                    re.search(r'\bextern\s*$', head):
                stack.append(("scope", line))
            elif at_scope and AFTER_PARAMS.search(head.rstrip()):
                stack.append(("body", line))
            else:
                stack.append(("inner", line))
        elif ch == "}" and stack:
            kind, start = stack.pop()
            if kind == "body":
                bodies.append((start, line))
    return bodies


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--max-file-lines", type=int, default=600)
    ap.add_argument("--max-function-lines", type=int, default=60)
    args = ap.parse_args()
    root = pathlib.Path(args.root)
    breaches = []
    files = sorted(p for top in ("src", "models") for p in (root / top).rglob("*")
                   if p.suffix in (".cpp", ".h", ".cu"))
    for path in files:
        text = path.read_text(errors="replace")
        rel = path.relative_to(root)
        lines = text.count("\n") + (0 if text.endswith("\n") else 1)
        if lines > args.max_file_lines:
            breaches.append(f"{rel}:1: {lines} lines, more than {args.max_file_lines}")
        for start, end in function_bodies(text):
            n = end - start + 1
            if n > args.max_function_lines:
                breaches.append(f"{rel}:{start}: a function of {n} lines, more than "
                                f"{args.max_function_lines}")
    for b in breaches:
        print(b)
    print(f"{len(files)} files checked: {len(breaches)} over the limits", file=sys.stderr)
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
