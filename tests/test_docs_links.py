"""The documentation's links: every relative link and image in README.md and docs/**/*.md resolves.

A link ``path`` must name a file or folder that exists (relative to the page); ``path#anchor`` and
``#anchor`` must also name a heading of the target page, by GitHub's slug rules (lowercase; every
character that is not a letter, digit, underscore, hyphen or space dropped; spaces to hyphens; a
repeated heading gets ``-1``, ``-2``, ...). Links inside fenced code blocks and inline code are not
links; http(s) and mailto links are not checked. Also: the README stays short (at most 220 lines) and
shows the two commands, ``make bench`` and ``make test``, on its first screen (first 30 lines).
Pure file reading: no run, no import of ds_bench."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README_MAX_LINES = 220
FIRST_SCREEN_LINES = 30

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    in_fence = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield number, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading slug of a markdown file, duplicates numbered as GitHub numbers them."""
    seen: Counter[str] = Counter()
    found = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def broken_links(page: Path) -> list[str]:
    """One line per link of ``page`` that does not resolve: 'page:line: target (why)'."""
    problems = []
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        for match in LINK.finditer(line):
            target = match.group(1)
            if re.match(r"^(https?:|mailto:)", target, re.IGNORECASE):
                continue
            path_part, _, anchor = target.partition("#")
            shown = page.relative_to(REPO) if page.is_relative_to(REPO) else page.name
            where = f"{shown}:{number}: {target}"
            resolved = (page.parent / path_part).resolve() if path_part else page
            if not resolved.exists():
                problems.append(f"{where} (no such file)")
                continue
            if anchor:
                if resolved.is_dir() or resolved.suffix.lower() != ".md":
                    problems.append(f"{where} (an anchor into a file that is not markdown)")
                elif anchor not in anchors(resolved):
                    problems.append(f"{where} (no heading with anchor #{anchor} in {resolved.name})")
    return problems


def doc_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_every_relative_link_and_image_in_the_readme_and_docs_resolves():
    pages = doc_pages()
    assert len(pages) > 10, pages  # the docs folder was found
    problems = [problem for page in pages for problem in broken_links(page)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_readme_is_short_and_shows_the_two_commands_on_its_first_screen():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    first_screen = "\n".join(lines[:FIRST_SCREEN_LINES])
    assert "make bench" in first_screen and "make test" in first_screen


def test_the_checker_catches_a_broken_link_and_a_broken_anchor(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "img.png").write_bytes(b"\x89PNG")
    (tmp_path / "sub" / "other.md").write_text("# Other page\n\n## The `--flag`: it, twice\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page: one\n\n"
        "[fine](sub/other.md) [fine anchor](sub/other.md#the---flag-it-twice) [numbered](sub/other.md#twice-1)\n"
        "[local](#page-one) ![image](img.png) [web](https://example.org/x#y) `[code](missing.md)`\n"
        "[gone](missing.md)\n"
        "[bad anchor](sub/other.md#no-such-heading)\n"
        "![gone image](missing.png)\n"
        "[bad local](#nowhere)\n"
        "```\n[in a fence](missing-too.md)\n```\n"
    )
    problems = broken_links(page)
    assert problems == [
        "page.md:5: missing.md (no such file)",
        "page.md:6: sub/other.md#no-such-heading (no heading with anchor #no-such-heading in other.md)",
        "page.md:7: missing.png (no such file)",
        "page.md:8: #nowhere (no heading with anchor #nowhere in page.md)",
    ], problems


def test_slugs_follow_githubs_rules():
    assert slug("The sweep: which configuration to use") == "the-sweep-which-configuration-to-use"
    assert slug("Engines: DeepSpeed, DDP, FSDP (`--engine`)") == "engines-deepspeed-ddp-fsdp---engine"
    assert slug("DeepSpeed configs (`ds_configs/`)") == "deepspeed-configs-ds_configs"
    assert slug("Across nodes: mpirun, srun — rendezvous") == "across-nodes-mpirun-srun--rendezvous"
