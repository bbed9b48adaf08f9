"""The man pages and the bash completion stay in step with --help, and
gpuckptfs(8) with its manual.

gpuckpt(1) and gpuckptfs(8) are made at build time by help2man (man/); here
every option that `--help` (and, for gpuckpt, each subcommand's `--help`)
lists must appear in the page as `man -l` renders it, rendering must give
no warning, and the sections --help lacks must be there. The rest of
gpuckptfs(8) is made from its manual, docs/gpuckptfs.md: each of the
manual's `##` sections must be a section of the page, in the manual's
order, each `###` one a subsection, and every word of the manual must be
in the page (but for the first paragraph, which says what the manual is).
The hand-written completion (tools/gpuckpt/gpuckpt.bash-completion) is
sourced in bash and asked, as bash would ask it, for the subcommands and
for the options of gpuckpt and of each subcommand: each answer must equal
what --help lists. No root, mount or CRIU needed.
"""

import os
import re
import shutil
import subprocess

import pytest

BUILD = os.environ.get("WORKLOAD_BIN", "")
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPUCKPT = os.path.join(BUILD, "tools", "gpuckpt", "gpuckpt")
GPUCKPTFS = os.environ.get("GPUCKPTFS", "")
COMPLETION = os.path.join(SOURCE, "tools", "gpuckpt", "gpuckpt.bash-completion")
MANUAL = os.path.join(SOURCE, "docs", "gpuckptfs.md")


def run(args, **kwargs):
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, **kwargs)
    assert r.returncode == 0, f"{args}: exit {r.returncode}: {r.stderr}"
    return r


def help_sections(text):
    """{section title: [lines]} of CLI11's --help ("Options:", "Subcommands:")."""
    sections, current = {}, None
    for line in text.splitlines():
        m = re.match(r"^([A-Z][A-Za-z ]*):\s*$", line)
        if m:
            current = sections.setdefault(m.group(1).lower(), [])
        elif current is not None and line.strip():
            current.append(line)
    return sections


def help_options(text):
    """The options a --help text lists ("-h", "--help", "--store", ...)."""
    options = set()
    for line in help_sections(text).get("options", []):
        m = re.match(r"^\s+(-\S+)", line)
        if m:
            # "-h,--help", "--store", "--no-page-aware"
            for name in m.group(1).split(","):
                options.add(re.match(r"-[-\w]*", name).group(0))
    assert options, f"no options found in:\n{text}"
    return options


def help_subcommands(text):
    names = [line.split()[0] for line in help_sections(text).get("subcommands", [])
             if re.match(r"^\s+\S", line)]
    assert names, f"no subcommands found in:\n{text}"
    return names


def gpuckpt_help(*sub):
    return run([GPUCKPT, *sub, "--help"]).stdout


def rendered(page):
    """`man -l` of `page` as text, and what it said on stderr."""
    env = dict(os.environ, MANWIDTH="120", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="")
    r = subprocess.run(["man", "--warnings=all", "-l", page], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, f"man -l {page}: exit {r.returncode}: {r.stderr}"
    # groff may draw hyphens and minus signs as Unicode dashes.
    text = r.stdout.replace("\u2010", "-").replace("\u2212", "-")
    return text, r.stderr


@pytest.fixture(scope="module", autouse=True)
def built():
    if not os.access(GPUCKPT, os.X_OK):
        pytest.skip(f"WORKLOAD_BIN={BUILD!r} holds no built gpuckpt (tools/gpuckpt/gpuckpt)")
    if shutil.which("man") is None:
        pytest.skip("man (Debian's man-db) is not installed: tools/setup installs it")


@pytest.mark.parametrize("name,section", [("gpuckpt", 1), ("gpuckptfs", 8)])
def test_man_page_has_every_option_and_renders_without_warnings(name, section):
    page = os.path.join(BUILD, "man", f"{name}.{section}")
    assert os.path.isfile(page), f"{page} was not built"
    text, warnings = rendered(page)
    assert warnings == "", f"man -l {page} warned:\n{warnings}"

    if name == "gpuckpt":
        top = gpuckpt_help()
        wanted = {("", o) for o in help_options(top)}
        for sub in help_subcommands(top):
            wanted |= {(sub, o) for o in help_options(gpuckpt_help(sub))}
        headings = ["SYNOPSIS", "DESCRIPTION", "EXIT STATUS", "FILES", "EXAMPLES"]
    else:
        wanted = {("", o) for o in help_options(run([GPUCKPTFS, "--help"]).stdout)}
        headings = ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "THE TREE", "CONTROL FILES",
                    "PERMISSIONS", "FILES", "EXAMPLES", "SEE ALSO"]
    missing = sorted(f"{sub} {o}".strip() for sub, o in wanted
                     if not re.search(r"(?<![\w-])" + re.escape(o) + r"(?![\w-])", text))
    assert not missing, f"{page} lacks options that --help lists: {missing}"
    for heading in headings:
        assert re.search(rf"^{heading}$", text, re.M), f"{page} has no {heading} section"
    # The page's header names the version --version prints.
    version = run([GPUCKPT if name == "gpuckpt" else GPUCKPTFS, "--version"]).stdout.split()[1]
    assert version in text.splitlines()[-1], f"{page} does not name version {version}"


def manual_headings():
    """The `##` and `###` headings of docs/gpuckptfs.md, in order, as
    (level, title), leaving out code blocks."""
    headings, fenced = [], False
    with open(MANUAL, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            m = None if fenced else re.match(r"^(##|###) (.+?)\s*$", line)
            if m:
                headings.append((len(m.group(1)), m.group(2)))
    assert headings, f"{MANUAL} has no ## headings"
    return headings


SUBCOMMANDS = ("import", "export", "ls", "rm", "gc", "fsck", "stats")


def test_help_says_types_and_defaults_without_the_parsers_own_notation():
    """No validator's inner text ("INT:INT in [-100 - 22]", "ENUM:value in
    {...}") and no flag's stored value ("--no-page-aware{false}")."""
    texts = [run([GPUCKPTFS, "--help"]).stdout, run([GPUCKPT, "--help"]).stdout]
    texts += [run([GPUCKPT, sub, "--help"]).stdout for sub in SUBCOMMANDS]
    for text in texts:
        for line in help_sections(text).get("options", []):
            assert not re.search(r"\{|\}|:[A-Z]+\b| in \[|->", line), line


def test_gpuckptfs_page_holds_the_manual():
    page = os.path.join(BUILD, "man", "gpuckptfs.8")
    assert os.path.isfile(page), f"{page} was not built"
    text, _ = rendered(page)
    lines = text.splitlines()

    # Each `##` section of the manual is a section of the page (in capitals,
    # as man pages write them), each `###` one a subsection, in order.
    where = 0
    for level, title in manual_headings():
        wanted = title.upper() if level == 2 else "   " + title
        found = wanted in lines[where:]
        assert found, (f"{page} lacks the manual's {'#' * level} {title!r} "
                       f"(or has it out of the manual's order)")
        where = lines.index(wanted, where) + 1

    # Every word of the manual reaches the page: none is lost on the way
    # (a line that roff would take for a request, a section left out).
    with open(MANUAL, encoding="utf-8") as f:
        manual = f.read()
    manual = manual.split("\n\n", 2)[2]  # the title and the first paragraph
    manual = re.sub(r"\]\([^)]*\)", "]", manual)  # links: their text, not where they go
    said = set(re.findall(r"\w{3,}", text.lower()))
    missing = sorted(set(re.findall(r"\w{3,}", manual.lower())) - said)
    assert not missing, f"{page} lacks words of the manual: {missing}"


def complete(*words):
    """What _gpuckpt offers for the command line `words` (the last one being
    completed), as bash would call it."""
    script = f"""
source {COMPLETION!r}
COMP_WORDS=("$@")
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
COMP_LINE="${{COMP_WORDS[*]}}"
_gpuckpt gpuckpt "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    r = run(["bash", "--norc", "--noprofile", "-c", script, "bash", "gpuckpt", *words])
    return [w for w in r.stdout.splitlines() if w]


def test_completion_offers_the_subcommands_and_options_help_lists():
    # `complete` is registered for the command.
    r = run(["bash", "--norc", "--noprofile", "-c", f"source {COMPLETION!r}; complete -p gpuckpt"])
    assert "-F _gpuckpt" in r.stdout

    top = gpuckpt_help()
    subcommands = help_subcommands(top)
    assert sorted(complete("")) == sorted(subcommands)
    assert sorted(complete("-")) == sorted(help_options(top))
    for sub in subcommands:
        wanted = sorted(help_options(gpuckpt_help(sub)))
        assert sorted(complete(sub, "-")) == wanted, f"options of {sub}"
        # Global options before the subcommand are skipped, values and all.
        assert sorted(complete("--store", "/tmp", sub, "-")) == wanted, f"{sub} after --store"
    # Prefixes narrow the answer.
    assert complete("st") == ["stats"]
    assert complete("ls", "--j") == ["--json"]


def test_completion_offers_directories_where_help_wants_one(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "a-file").write_text("")
    prefix = str(tmp_path) + "/"
    assert complete("--store", prefix) == [prefix + "images"]
    assert complete("import", prefix) == [prefix + "images"]
    # export ID DEST_DIR: the id is not completed, the destination is.
    assert complete("export", prefix) == []
    assert complete("export", "7", prefix) == [prefix + "images"]
    assert complete("rm", prefix) == []
