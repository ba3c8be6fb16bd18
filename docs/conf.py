"""Sphinx for distckpt's site: the Markdown guides (MyST), the C++ reference from the public
headers (Doxygen XML through Breathe), the Python reference (autodoc of the built package)
and the CLI reference (each command's --help). Built by `cmake --build build --target docs`
(scripts/build_docs.sh), which passes the paths below in the environment; warnings are
errors (sphinx-build -W)."""
import os
import sys

project = "distckpt"
author = "the distckpt authors"
copyright = "the distckpt authors, Apache-2.0"
release = version = os.environ.get("DISTCKPT_VERSION", "")

extensions = ["myst_parser", "breathe", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "benchmarks/data", "Doxyfile.in"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

breathe_projects = {"distckpt": os.environ.get("DISTCKPT_DOXYGEN_XML", "")}
breathe_default_project = "distckpt"
breathe_default_members = ("members",)

# The Python package as built (its extension module included): autodoc imports it.
if os.environ.get("DISTCKPT_PYTHON_DIR"):
    sys.path.insert(0, os.environ["DISTCKPT_PYTHON_DIR"])
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings say the types; the stubs (.pyi) are for checkers

html_theme = "alabaster"
html_title = f"distckpt {release}"
html_static_path = []

# Suppressed warnings, each with its reason (everything else fails the build):
suppress_warnings = [
    # The guides link to files of the repository outside docs/ (CONTRIBUTING.md, sources,
    # tests): on GitHub they resolve, on the site they are no pages of it.
    "ref.myst",
    # C++ declarations Breathe emits once per overload set and Sphinx's C++ domain reports
    # as duplicates (Result<T>'s constructors, operator overloads of Box and Shape).
    "cpp.duplicate_declaration",
]
