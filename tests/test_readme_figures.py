"""The README's measured figures are the ones bench/RESULTS.md records.

A README figure is a number (or range) in GB/s, x or %, in a sentence that cites bench/RESULTS.md or a
measurement date, or in a later sentence of the same paragraph (README paragraphs cite once, then go on),
unless the sentence says "published" (others' figures, which the design notes cite).
It is checked against the RESULTS.md entries of the date its sentence names, else of the date the last
citing sentence of its paragraph named, else against every entry. It holds where such an entry records the
same number: the same text, or a decimal rounded to the digits the README gives (47.68 -> "47.7"); a whole
number must be recorded as written. A number followed by a unit must carry that unit in RESULTS.md, except
in a table row, whose unit is in its header. A range holds where both its ends do. A figure that only a
`###` section records which a later section of the same title re-measured is stale, and so is one a later
entry quotes as an earlier session's (`(session 2: 15 GB/s at best)`): such asides are not sources.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RESULTS = ROOT / "bench" / "RESULTS.md"

DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
CITES = re.compile(r"RESULTS\.md|\b20\d\d-\d\d-\d\d\b")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(])")
NUMBER = r"\d+(?:\.\d+)?"
# "4x H200" counts GPUs; "8 x 64 tokens" is a shape: neither is a ratio
UNIT = r"GB/s|%|x(?!\s?(?:[HB]\d|GPU))(?![\w-])"
FIGURE = re.compile(rf"(?<![\w.±+-])({NUMBER})(?:[-–]({NUMBER}))?(?:\s?({UNIT}))?")
SESSION_ASIDE = re.compile(r"\(session \d+:[^)]*\)")


def _unit(text: str | None) -> str | None:
    return None if text is None else ("x" if text.startswith("x") else text)


class Entries:
    """RESULTS.md cut into parts (the text of one `##` entry before its first `###`, or of one `###` section).

    Each part knows its date, its title (None for an entry's opening text) and the (number, unit) pairs it
    records; unit None: a bare number in a table row, which stands for any unit.
    """

    def __init__(self, text: str):
        self.parts: list[tuple[str | None, str | None, set[tuple[str, str | None]]]] = []
        date, title, lines = None, None, []
        for line in text.splitlines() + ["## end"]:
            if line.startswith("## ") or line.startswith("### "):
                self.parts.append((date, title, self._figures(lines)))
                lines = []
                if line.startswith("## "):
                    found = DATE.search(line)
                    date, title = (found.group(0) if found else None), None
                else:  # "### The plugin's own loopback stream (`ccbridge bench net`)": the title before its command
                    title = re.sub(r"\s*\(.*$", "", line[4:]).strip().lower()
            else:
                lines.append(line)

    @staticmethod
    def _figures(lines: list[str]) -> set[tuple[str, str | None]]:
        found = set()
        for line in lines:
            table = line.lstrip().startswith("|")
            for m in FIGURE.finditer(SESSION_ASIDE.sub("", line)):
                unit = _unit(m.group(3))
                if unit or (table and not re.match(r"\s?[A-Za-z/]", line[m.end():])):  # "48 us" is no bare figure
                    found.update((end, unit) for end in m.groups()[:2] if end)
        return found

    def live(self, index: int) -> bool:
        """False for a `###` section that a later section of the same title re-measured."""
        title = self.parts[index][1]
        return title is None or all(t != title for _, t, _ in self.parts[index + 1:])

    def where(self, number: str, unit: str | None, dates: set[str] | None) -> list[int]:
        """The parts (of those dates, if given) that record number with unit, as written or rounded to it."""
        return [i for i, (date, _, figures) in enumerate(self.parts)
                if (dates is None or date in dates)
                and any((u is None or u == unit) and _same(number, n) for n, u in figures)]


def _same(readme: str, recorded: str) -> bool:
    if readme == recorded or "." not in readme:
        return readme == recorded
    digits = Decimal(1).scaleb(-len(readme.split(".")[1]))
    return Decimal(recorded).quantize(digits, ROUND_HALF_UP) == Decimal(readme)


def readme_figures(text: str):
    """(figure text, its sentence, the dates it is checked against or None, number ends, unit) of text."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for paragraph in re.split(r"\n\s*\n", text):
        dates: set[str] | None = None
        cited = False
        for sentence in SENTENCE_END.split(" ".join(paragraph.split())):
            if CITES.search(sentence):
                cited, dates = True, set(DATE.findall(sentence)) or None
            if not cited or "published" in sentence:  # others' figures, cited from their papers
                continue
            for m in FIGURE.finditer(sentence):
                if m.group(3):
                    yield m.group(0), sentence, dates, [e for e in m.groups()[:2] if e], _unit(m.group(3))


def problems(readme: str, results: str) -> list[str]:
    entries = Entries(results)
    out = []
    for figure, sentence, dates, ends, unit in readme_figures(readme):
        where = [entries.where(end, unit, dates) for end in ends]
        scope = ", ".join(sorted(dates)) if dates else "any date"
        if not all(where):
            out.append(f"{figure!r} ({scope}) is not in bench/RESULTS.md: {sentence[:100]}")
        elif not all(any(entries.live(i) for i in w) for w in where):
            out.append(f"{figure!r} ({scope}) is stale: a later entry re-measured it: {sentence[:100]}")
    return out


def test_every_readme_figure_is_a_recorded_one():
    assert problems(README.read_text(), RESULTS.read_text()) == []


def test_the_check_finds_figures_at_all():
    """Guard against a pattern that silently matches nothing: the README's cited figures are found."""
    figures = [f for f, *_ in readme_figures(README.read_text())]
    assert len(figures) >= 10 and "1.08x" in figures


OLD_LOOPBACK = """\
ccbridge [--wrap fsdp]`. On 4x H200 (bench/RESULTS.md, 2026-11-22) NCCL on the
plugin moved 2.1-3.8x the busbw of NCCL's sockets at their defaults from
64 MiB. The loopback stream tops out near 15 GB/s
(the kernel carries 36-40 GB/s with as many plain streams), short of a
200 Gb/s link.
"""


def test_the_stale_loopback_line_fails():
    """The README said this after 2026-11-22 session 4 measured 28.75 GB/s: 15 and 36-40 were session 2's."""
    found = problems(OLD_LOOPBACK, RESULTS.read_text())
    assert len(found) == 2 and all("stale" in p for p in found)
    assert "'15 GB/s'" in found[0] and "'36-40 GB/s'" in found[1]


@pytest.mark.parametrize("readme, verdict", [
    ("On an H100 (bench/RESULTS.md): 47.7 GB/s.", None),              # 47.68 rounded to the README's digit
    ("On 4 H200s (bench/RESULTS.md, 2026-11-21): 188.5 GB/s.", None),  # the cipher kernels' 1 GiB row
    ("On 4 H200s (bench/RESULTS.md, 2026-11-21): 189 GB/s.", "not in"),  # a whole number must be recorded as written
    ("On an H100 (bench/RESULTS.md): 47.9 GB/s.", "not in"),
    ("On an H100 (bench/RESULTS.md, 2026-11-23): 47.7 GB/s.", "not in"),  # recorded, but not on that date
    ("On 4x H200 (bench/RESULTS.md, 2026-11-22): 188.5 GB/s.", "not in"),
    ("Measured (bench/RESULTS.md, 2026-11-23). The published drain closed 92.5% of it.", None),
    ("Measured (bench/RESULTS.md). Later: 99.99x faster.", "not in"),  # a later sentence inherits the citation
    ("No citation here: 99.99x faster.", None),
    ("On 4 H200s (bench/RESULTS.md): 0.10-0.19x.", None),             # 0.098 and 0.188, rounded
])
def test_rules(readme, verdict):
    found = problems(readme, RESULTS.read_text())
    assert (found == []) if verdict is None else (len(found) == 1 and verdict in found[0]), found
