#!/usr/bin/env bash
# The site: Doxygen XML of the public headers, the CLI reference from each command's --help,
# Sphinx over docs/ (warnings are errors), then the checks: every public function of the
# headers is in the C++ reference, and headless Chromium renders the front page and the
# concepts guide to PNGs that are not blank. Run by `cmake --build build --target docs`.
# Usage: build_docs.sh SOURCE_DIR BUILD_DIR [test]
# Without sphinx-build, doxygen, chromium or the built Python package it says so and exits 0
# (with `test`: 77, a skip), except where DISTCKPT_REQUIRE_DOCS=1 (CI): then it fails.
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
py=${PYTHON:-/usr/bin/python3}
missing=""
for tool in sphinx-build doxygen chromium; do command -v "$tool" > /dev/null || missing+=" $tool"; done
[ -d "$build/python/distckpt" ] || missing+=" the-built-python-package"
"$py" -c "import myst_parser, breathe, PIL" 2> /dev/null || missing+=" python3-myst-parser/python3-breathe/python3-pil"
if [ -n "$missing" ]; then
  echo "docs: skipped, missing:$missing (bash scripts/setup.sh --docs installs the toolchain)"
  [ "${DISTCKPT_REQUIRE_DOCS:-0}" = 1 ] && exit 1
  [ "${3:-}" = test ] && exit 77
  exit 0
fi
out=$build/docs
"$py" "$src/scripts/doc_comments.py" --check "$src"/include/distckpt/*.h
rm -rf "$out"
mkdir -p "$out/doxygen"
stage=$out/source
cp -r "$src/docs" "$stage"
# The benchmark plots, drawn again from the figures kept in docs/benchmarks/data/.
"$py" "$src/scripts/plot_benchmarks.py" "$stage/benchmarks/data" "$stage/benchmarks"

# C++: Doxygen's XML (docs/Doxyfile.in, configured by CMake into the build tree).
doxygen "$build/Doxyfile" > "$out/doxygen.log" 2>&1 || { cat "$out/doxygen.log"; exit 1; }

# CLI: each command's --help, verbatim.
cli=$build/distckpt
{
  echo "# Command line"
  echo
  echo "Generated from \`distckpt --help\` and each command's \`--help\` (distckpt $("$cli" --version | awk '{print $2}')). The [CLI guide](../guide/cli.md) explains them."
  echo
  # Run as `distckpt` from the build tree, so that usage lines name the command, not a path.
  echo '```text'
  (cd "$build" && PATH="$build:$PATH" distckpt --help)
  echo '```'
  commands=$("$cli" --help | awk '/^Subcommands:/ {on = 1; next} on && NF {print $1}')
  [ -n "$commands" ] || { echo "docs: no subcommands found in distckpt --help" >&2; exit 1; }
  for cmd in $commands; do
    echo
    echo "## \`distckpt $cmd\`"
    echo
    echo '```text'
    (cd "$build" && PATH="$build:$PATH" distckpt "$cmd" --help)
    echo '```'
  done
} > "$stage/reference/cli.md"

DISTCKPT_VERSION=$("$cli" --version | awk '{print $2}') \
DISTCKPT_DOXYGEN_XML=$out/doxygen/xml \
DISTCKPT_PYTHON_DIR=$build/python \
  sphinx-build -W --keep-going -q -b html "$stage" "$out/html"

# Every public function and class of the headers appears in the C++ reference.
"$py" - "$out/doxygen/xml" "$out/html/reference/cpp.html" <<'PY'
import glob, re, sys, xml.etree.ElementTree as ET
html = open(sys.argv[2]).read()
missing = []
for path in glob.glob(sys.argv[1] + "/namespacedistckpt.xml") + glob.glob(sys.argv[1] + "/classdistckpt_1_1*.xml") \
        + glob.glob(sys.argv[1] + "/structdistckpt_1_1*.xml"):
    root = ET.parse(path).getroot()
    for m in root.iter("memberdef"):
        if m.get("kind") == "function" and m.get("prot", "public") == "public":
            name = m.findtext("name")
            if name and not name.startswith("operator") and f">{name}<" not in html and f"{name}</span>" not in html:
                missing.append(f"{root.find('compounddef').findtext('compoundname')}::{name}")
if missing:
    print("docs: public functions missing from the C++ reference:", ", ".join(sorted(set(missing))))
    sys.exit(1)
print("docs: every public function is in the C++ reference")
PY

# Every public name of the Python package is rendered in the Python reference (autodoc's
# directives, not their source text), and every command has its section in the CLI's.
PYTHONPATH=$build/python "$py" - "$out/html/reference/python.html" "$out/html/reference/cli.html" $commands <<'PY'
import re, sys
import distckpt, distckpt.torch
html = open(sys.argv[1]).read()
if ".. py:" in html or ".. automodule" in html:
    print("docs: the Python reference shows autodoc's source text, not its output"); sys.exit(1)
rendered = set(re.findall(r'<span class="pre">([A-Za-z_][A-Za-z_0-9]*)</span></span>', html))
missing = [f"{m.__name__}.{n}" for m in (distckpt, distckpt.torch) for n in m.__all__
           if callable(getattr(m, n)) and n not in rendered]  # functions and classes
if missing:
    print("docs: missing from the Python reference:", ", ".join(missing)); sys.exit(1)
cli = open(sys.argv[2]).read()
absent = [c for c in sys.argv[3:] if f"distckpt {c}" not in cli]
if absent:
    print("docs: commands missing from the CLI reference:", ", ".join(absent)); sys.exit(1)
print("docs: every public Python function and class, and every command, is in its reference")
PY

# Every image the pages show exists (sphinx-build -W refuses a missing one) and parses.
"$py" - "$out/html/_images" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
from PIL import Image
images = glob.glob(sys.argv[1] + "/*")
for path in images:
    if path.endswith(".svg"):
        ET.parse(path)
    else:
        Image.open(path).verify()
print(f"docs: {len(images)} images parse")
PY

# Headless Chromium renders two pages; each PNG must show more than one colour.
for page in index guide/concepts; do
  png=$out/$(echo "$page" | tr / -).png
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1200,1600 \
    --screenshot="$png" "file://$out/html/$page.html" > "$out/chromium.log" 2>&1 || { cat "$out/chromium.log"; exit 1; }
  "$py" - "$png" <<'PY'
import sys
from PIL import Image
image = Image.open(sys.argv[1]).convert("RGB")
colours = image.getcolors(maxcolors=1 << 20)
if colours is not None and len(colours) < 2:
    print(f"docs: {sys.argv[1]} is blank"); sys.exit(1)
print(f"docs: {sys.argv[1]} rendered ({image.size[0]}x{image.size[1]})")
PY
done
echo "docs: the site is in $out/html"
