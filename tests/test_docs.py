"""The documentation holds to what it promises: pages within their length, every relative link and
anchor resolving, every benchmark record cited and every cited record present, and the file tables
naming the files that exist."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '#' in a code block is no heading
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def _links(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if not re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not checked here
            yield target


@pytest.mark.parametrize("name,limit", [("README.md", 200), ("docs/cost_model.md", 300), ("docs/gpu_check.md", 150)])
def test_page_within_its_length(name, limit):
    lines = len((ROOT / name).read_text().splitlines())
    assert lines <= limit, f"{name} has {lines} lines, over its {limit}: move detail to the page that owns it"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def _all_text():
    return "\n".join(p.read_text() for p in PAGES)


def test_every_benchmark_record_is_cited():
    text = _all_text()
    orphans = [f.name for f in sorted((DOCS / "bench").iterdir()) if f.name not in text]
    assert not orphans, f"docs/bench holds records no page cites: {orphans}; cite them or git rm them"


def test_every_cited_benchmark_record_exists():
    cited = set(re.findall(r"bench/([\w.-]+\.(?:json|png))", _all_text()))
    missing = sorted(name for name in cited if not (DOCS / "bench" / name).exists())
    assert not missing, f"pages cite docs/bench records that do not exist: {missing}"


def _section(page, heading):
    text = page.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else None]


def test_triton_file_table_lists_the_package():
    table = _section(DOCS / "triton.md", "## Layout")
    named = set(re.findall(r"^\| `([\w.]+\.py)`", table, flags=re.M))
    present = {p.name for p in (ROOT / "splatloss" / "backends" / "triton").glob("*.py")}
    assert named == present, (
        f"docs/triton.md's file table: missing {sorted(present - named)}, naming absent files {sorted(named - present)}"
    )


def test_architecture_change_table_names_existing_paths():
    table = _section(DOCS / "architecture.md", "## To change")
    paths = [p for p in re.findall(r"`([\w./-]+)`", table) if "/" in p or p.endswith((".py", ".yaml", ".c"))]
    assert len(paths) >= 15, paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md's 'To change' table names paths that do not exist: {missing}"


def test_performance_keeps_the_host_time_anchor():
    assert "host-time" in _anchors(DOCS / "performance.md")


def test_contributing_timing_paragraph_is_short():
    paragraphs = (ROOT / "CONTRIBUTING.md").read_text().split("\n\n")
    timed = [p for p in paragraphs if re.search(r"\d+ min \d+ s", p)]
    assert len(timed) == 1, f"CONTRIBUTING.md: {len(timed)} paragraphs give suite timings; keep one"
    assert len(timed[0].splitlines()) <= 5, timed[0]


def test_architecture_change_table_names_every_tool():
    table = _section(DOCS / "architecture.md", "## To change")
    tools = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tools").glob("*.py") if p.name != "__init__.py")
    missing = [t for t in tools if f"`{t}`" not in table]
    assert not missing, f"docs/architecture.md's 'To change' table: no row names {missing}; add one per tool"


# A path the docs name, in prose or in a command; a glob (tests/test_triton_*.py) or a placeholder is no path.
REPO_PATH = re.compile(r"(?<![\w./-])((?:tools|tests|scripts|configs|splatloss)/[\w./-]*\w)(?![\w*<{])")


def test_named_repository_paths_exist():
    missing = [
        f"{page.relative_to(ROOT)}: {path}"
        for page in PAGES
        for path in sorted(set(REPO_PATH.findall(page.read_text())))
        if not (ROOT / path).exists()
    ]
    assert not missing, f"the docs name files that do not exist: {missing}; name the file that holds it now"


def _dev_commands():
    """``./dev <command>`` and each option a command branches on (``./dev bench --host``), from the
    usage lines at the top of ``dev``."""
    head = [line for line in (ROOT / "dev").read_text().splitlines() if line.startswith("#   ./dev ")]
    found = []
    for line in head:
        command = line.split()[2]
        found.append(f"./dev {command}")
        found += [f"./dev {command} {option}" for option in re.findall(r"(--[\w-]+): ", line)]
    return found


def test_contributing_command_table_names_every_dev_command():
    table = _section(ROOT / "CONTRIBUTING.md", "## Set-up and the commands")
    rows = re.findall(r"^\| `([^`]+)`", table, flags=re.M)
    commands = _dev_commands()
    assert "./dev test" in commands and "./dev bench" in commands, commands
    missing = [c for c in commands if not any(r == c or r.startswith(c + " ") for r in rows)]
    assert not missing, f"CONTRIBUTING.md's command table has no row for {missing} (the commands dev's usage lists)"


def test_named_environment_variables_are_read():
    """Every ``SPLATLOSS_*`` variable a page names is one the package or a tool reads."""
    code = "\n".join(p.read_text() for d in ("splatloss", "tools") for p in (ROOT / d).rglob("*.py"))
    named = sorted(set(re.findall(r"\bSPLATLOSS_[A-Z0-9_]+\b", _all_text())))
    unread = [v for v in named if v not in code]
    assert not unread, f"the docs name environment variables nothing reads: {unread}; name the switch that exists"


# What the code cites: ``README "Section"`` and ``docs/page.md ("Section")`` / ``docs/page.md, "Section"``
# (a bare docs/page.md may be a file a tool writes, such as tools/gpu_check.py's table).
CITED_README = re.compile(r"\bREADME \"([^\"]+)\"")
CITED_SECTION = re.compile(r"\bdocs/(\w+\.md)`*(?:'s)?,? \(?[\"']([^\"']+)[\"']")


def _headings(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [h.replace("`", "") for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)]


def _sources():
    for folder in ("splatloss", "tools", "configs", "scripts"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".yaml", ".c"):
                yield path


def test_the_code_cites_sections_that_exist():
    """A docstring or comment that sends the reader to a section of a page sends them somewhere real
    (a section by the start of its heading: "Evaluation" for "Evaluation, loggers and sweep reports")."""
    broken = []
    for path in _sources():
        text = path.read_text()
        cites = [("README.md", s) for s in CITED_README.findall(text)]
        cites += [(f"docs/{page}", s) for page, s in CITED_SECTION.findall(text)]
        for page, section in cites:
            section = " ".join(re.sub(r"\n\s*#?", " ", section).split())  # a citation wrapped over two lines
            dest = ROOT / page
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {page} does not exist")
            elif not any(h.startswith(section) for h in _headings(dest)):
                broken.append(f"{path.relative_to(ROOT)}: {page} has no section {section!r}")
    assert not broken, "; ".join(sorted(set(broken)))
