#!/usr/bin/env python3
"""Makes the public headers' comments Doxygen's: a whole-line `//` comment becomes `///`
(it documents what follows), a comment after a member on its line becomes `///<` (it
documents that member). The text is unchanged. Idempotent; run on include/distckpt/*.h.

    python3 scripts/doc_comments.py include/distckpt/*.h
    python3 scripts/doc_comments.py --check include/distckpt/*.h   # exit 1 if any would change
"""
import re
import sys

WHOLE = re.compile(r"^(\s*)//(?!/)(.*)$")
TRAILING = re.compile(r"^(\s*[^/\s].*?[;,])(\s+)//(?![/<])(.*)$")


def convert(text):
    out = []
    for line in text.split("\n"):
        m = WHOLE.match(line)
        if m:
            line = f"{m.group(1)}///{m.group(2)}"
        else:
            m = TRAILING.match(line)
            if m and not m.group(1).lstrip().startswith(("}", "#")):
                line = f"{m.group(1)}{m.group(2)}///<{m.group(3)}"
        out.append(line)
    return "\n".join(out)


check = sys.argv[1:2] == ["--check"]
unconverted = []
for path in sys.argv[2 if check else 1:]:
    with open(path) as f:
        text = f.read()
    new = convert(text)
    if new != text:
        if check:
            unconverted.append(path)
        else:
            with open(path, "w") as f:
                f.write(new)
if unconverted:
    print("doc comments: '//' comments the reference would miss (run scripts/doc_comments.py on them):",
          " ".join(unconverted))
    sys.exit(1)
