"""The documentation cannot drift from the code unnoticed.

The site (``mkdocs.yml``, ``docs/``) builds with ``mkdocs build --strict``: a broken link
or anchor, or a page left out of the nav, fails it. Its CLI reference is generated from
the click commands. Every job in the docs and the README loads with txjoin's own job
loader, and every ``txjoin ...`` command line in them names a command and options that
exist (resolved against the click commands, not by running them).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from txjoin.cli import COMMAND_SECTIONS, main
from txjoin.job import Job, load_job

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')
JOB = re.compile(r"^job\s*=\s*Job\(", re.M)
SHELLS = {"bash", "sh", "shell", "console"}


def code_blocks(page: Path) -> Iterator[tuple[str, str, int]]:
    """(language, text, first line number) of each fenced block; included snippets resolved."""
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        start = FENCE.match(lines[i])
        if start is None:
            i += 1
            continue
        indent, lang = start.groups()
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i][len(indent):] if lines[i].startswith(indent) else lines[i]
            include = SNIPPET.match(line)
            if include is not None:
                body.extend((ROOT / include.group(1)).read_text().splitlines())
            else:
                body.append(line)
            i += 1
        yield lang, "\n".join(body) + "\n", i - len(body)
        i += 1


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly_with_the_cli_reference_generated(tmp_path: Path) -> None:
    done = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    reference = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for name in main.commands:
        assert f'id="txjoin-{name}"' in reference, f"txjoin {name} missing from the reference"
    assert "TXJOIN_BOOTSTRAP_SERVERS" in reference  # the options, as --help prints them


def test_a_broken_link_or_a_page_outside_the_nav_fails_the_build(tmp_path: Path) -> None:
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copytree(ROOT / "jobs", tmp_path / "jobs")  # the pages include job files
    (tmp_path / "scripts").mkdir()  # the job reference's hook
    shutil.copy(ROOT / "scripts" / "mkdocs_job_reference.py", tmp_path / "scripts")
    page = tmp_path / "docs" / "verify.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    (tmp_path / "docs" / "orphan.md").write_text("# A page no nav entry names\n")
    done = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr and "orphan.md" in done.stderr, done.stderr


def test_the_job_reference_shows_every_field_of_every_class_a_job_file_builds() -> None:
    # Issue 73 item 6: one page with Job(...)'s whole signature (where, semantics,
    # sources, the handling modes were spread over writing-jobs.md).
    import dataclasses
    import importlib.util

    import txjoin.job as job_module

    spec = importlib.util.spec_from_file_location(
        "job_reference", ROOT / "scripts" / "mkdocs_job_reference.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.job_reference()
    for name in hook.CLASSES:
        cls = getattr(job_module, name)
        assert f"## {name}\n" in page
        for f in dataclasses.fields(cls):
            if f.init and not f.name.startswith("_"):
                assert f"{f.name}:" in page.split(f"## {name}\n")[1].split("## ")[0], \
                    (name, f.name)
    prose = re.sub(r"```text\n.*?\n```", "", page, flags=re.S)
    assert "``" not in prose and ":class:" not in prose  # reST turned into Markdown
    assert hook.MARKER in (ROOT / "docs" / "reference" / "job.md").read_text()


def test_every_job_in_the_docs_loads(tmp_path: Path) -> None:
    loaded = []
    for page in PAGES:
        for n, (lang, text, line) in enumerate(code_blocks(page)):
            if lang != "python":
                continue
            where = f"{page.relative_to(ROOT)}:{line}"
            compile(text, where, "exec")  # every Python block is at least Python
            if JOB.search(text) is None:
                continue
            path = tmp_path / f"{page.stem}_{n}.py"
            path.write_text(text)
            job = load_job(path)  # a JobError names the file and what is wrong
            assert isinstance(job, Job), where
            loaded.append(job.name)
    # orders, users_colors, users_colors_two_dbs, and the newcomer's my_orders (twice)
    assert {"orders", "users_colors", "users_colors_two_dbs", "my_orders"} <= set(loaded)


def command_lines(text: str) -> Iterator[list[str]]:
    """The ``txjoin`` invocations of a shell block, as argument lists after ``txjoin``."""
    for line in text.replace("\\\n", " ").splitlines():
        for part in re.split(r"&&|;|\|\|?", line):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                continue
            while words and re.match(r"^\w+=", words[0]):  # VAR=value before a command
                words = words[1:]
            if not words:
                continue
            if words[0] == "txjoin" or words[0].endswith("/txjoin"):
                yield words[1:]
            elif words[0] == "./scripts/demo.sh":
                yield ["demo", *words[1:]]


def check_command(argv: list[str]) -> None:
    """Resolve ``txjoin ARGV`` against the click commands: each subcommand exists, each
    option exists on its command (with a value where it takes one, one of its choices
    where it has them), and the positional arguments fit the command's."""
    command: click.Command = main
    path = ["txjoin"]
    args = list(argv)
    ctx: click.Context | None = None
    while True:  # the parent's context passes its settings (-h for --help) on
        ctx = click.Context(command, info_name=path[-1], parent=ctx, **command.context_settings)
        options = {name: p for p in command.params if isinstance(p, click.Option)
                   for name in (*p.opts, *p.secondary_opts)}
        # (not command.get_help_option(ctx): click keeps the first one it made, and a test
        # that invoked this command alone, without txjoin's -h, may have made it first)
        help_names = set(ctx.help_option_names) if command.add_help_option else set()
        positional: list[str] = []
        sub: click.Command | None = None
        i = 0
        while i < len(args):
            word = args[i]
            if word.startswith("-") and word != "-":
                name, eq, value = word.partition("=")
                option = options.get(name)
                if option is None and name not in help_names:
                    raise AssertionError(f"{' '.join(path)} has no option {name}")
                if option is not None and not (option.is_flag or option.count):
                    if not eq:
                        if i + 1 >= len(args):
                            raise AssertionError(f"{' '.join(path)} {name} needs a value")
                        i += 1
                        value = args[i]
                    if isinstance(option.type, click.Choice) and not value.startswith("$"):
                        assert value in option.type.choices, (
                            f"{' '.join(path)} {name} {value}: not one of {option.type.choices}")
                i += 1
                continue
            if isinstance(command, click.Group):
                sub = command.get_command(ctx, word)
                if sub is None:
                    raise AssertionError(f"{' '.join(path)} has no command {word!r}")
                path.append(word)
                args = args[i + 1:]
                break
            if path in (["txjoin", "submit-line"], ["txjoin", "package"]):
                # JOB_FILE, then `txjoin run`'s options
                check_command(["run", *args[i:]])
                return
            positional.append(word)
            i += 1
        if sub is not None:
            command = sub
            continue
        arguments = [p for p in command.params if isinstance(p, click.Argument)]
        most = float("inf") if any(a.nargs < 0 for a in arguments) else sum(
            a.nargs for a in arguments)
        least = sum(max(a.nargs, 1) for a in arguments if a.required)
        assert least <= len(positional) <= most, (
            f"{' '.join(path)} takes {least}..{most} arguments, got {positional}")
        return


def test_every_txjoin_command_line_in_the_docs_exists() -> None:
    checked = 0
    for page in PAGES:
        for lang, text, line in code_blocks(page):
            if lang not in SHELLS:
                continue
            for argv in command_lines(text):
                try:
                    check_command(argv)
                except AssertionError as exc:
                    raise AssertionError(f"{page.relative_to(ROOT)}:{line}: {exc}") from None
                checked += 1
    assert checked >= 40, f"only {checked} command lines found: is the extraction broken?"


@pytest.mark.parametrize("argv", [
    ["runn", "jobs/orders.py"],                                # no such command
    ["run", "jobs/orders.py", "--no-such-flag"],               # no such option
    ["run", "jobs/orders.py", "--on-incomplete", "never"],     # not one of the choices
    ["run"],                                                   # JOB_FILE missing
    ["job", "init", "--dsn"],                                  # an option without its value
    ["job", "nit", "--dsn", "x"],                              # no such subcommand
    ["verify", "a.py", "b.py"],                                # one argument too many
    ["submit-line", "--master", "spark://h:7077", "a.py", "--shard", "2"],  # not run's option
])
def test_the_command_check_refuses_a_wrong_line(argv: list[str]) -> None:
    with pytest.raises(AssertionError):
        check_command(argv)


@pytest.mark.parametrize("argv", [
    ["--verbose", "run", "jobs/orders.py", "--on-incomplete=skip", "--shards", "2"],
    ["job", "init", "--dsn", "postgresql://db/shop", "--tables", "public.orders"],
    ["replay", "a.yaml", "b.yaml", "--core-only"],
    ["down", "--wipe"],
    ["status", "-h"],
    ["submit-line", "--master", "spark://h:7077", "a.py", "--checkpoint-dir", "/c"],
])
def test_the_command_check_accepts_a_right_line(argv: list[str]) -> None:
    check_command(argv)


def code_text() -> str:
    """txjoin's source as one line of text in which an error message reads as it prints:
    string literals split over lines joined, ``{CONSTANT}`` replaced by the constant's
    text, backticks dropped."""
    text = "\n".join(p.read_text() for p in sorted((ROOT / "txjoin").rglob("*.py")))
    text = re.sub(r"""["']\s*\n\s*(?:rf|fr|f|r)?["']""", "", text)
    text = re.sub(r"\s+", " ", text)
    constants = dict(re.findall(r'\b([A-Z][A-Z0-9_]*) = \(?\s*f?"([^"]*)"', text))
    text = re.sub(r"\{([A-Z][A-Z0-9_]*)\}", lambda m: constants.get(m.group(1), m.group(0)),
                  text)
    return text.replace("`", "")


# What a troubleshooting entry writes for the parts of a message that vary: ..., a quoted
# value, an upper-case name (T, DIR, NAME), a number, a source's name before the colon.
PLACEHOLDER = re.compile(r"\.\.\.|(?<!\w)'[^']*'(?!\w)|\b(?:[A-Z][A-Z0-9_]*|\d\w*)\b"
                         r"|\b(?:kafka|txjoin_files|txjoin_replay):")


def unknown_error_text(phrase: str, code: str) -> list[str]:
    """The fixed parts (three words or more) of an error line that the code never says."""
    parts = [part.strip(" .,;:()[]") for part in PLACEHOLDER.split(phrase)]
    return [part for part in parts if len(part.split()) >= 3 and part not in code]


def test_every_error_line_in_troubleshooting_is_one_the_code_says() -> None:
    page = re.sub(r"\s*\n\s*", " ", (ROOT / "docs" / "troubleshooting.md").read_text())
    phrases = re.findall(r"\*\*`([^`]+)`\*\*", page)
    code = code_text()
    assert len(phrases) > 80, "the error lines are bold code spans"
    stale = {phrase: unknown for phrase in phrases
             if (unknown := unknown_error_text(phrase, code))}
    assert not stale, f"troubleshooting.md quotes errors the code no longer says: {stale}"
    assert unknown_error_text("no local stack is running in DIR", code) == []
    assert unknown_error_text("no local stack is running on Mars, ever", code) != []


def test_the_readme_links_only_to_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the docs"
    for link in local:
        assert (ROOT / link).exists(), f"README.md links to {link}, which does not exist"


def test_help_lists_every_command_in_one_section() -> None:
    sectioned = [name for _, names in COMMAND_SECTIONS for name in names]
    assert sorted(sectioned) == sorted(main.commands), "a command in no section, or in two"
    text = main.get_help(click.Context(main, info_name="txjoin"))
    positions = [text.index(f"{title}:") for title, _ in COMMAND_SECTIONS]
    assert positions == sorted(positions)
    assert "Other commands" not in text
