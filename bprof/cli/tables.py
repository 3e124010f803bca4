"""The one way the CLI prints a table: the full table when it fits the terminal, else each row
stacked as `column: value` pairs packed onto lines, so that no cell is ever cut ("expos…") or a
number split from its unit over two lines ("292.87 / ms"). `--json` output never comes here.

Cells are rich markup (callers escape untrusted text with `rich.markup.escape`), as for rich's
own Table.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

PAIR_GAP = "   "   # between two `column: value` pairs on one stacked line
INDENT = 2         # continuation lines of a stacked row


class Grid:
    """Rows under column headers; `print` chooses the layout for the console's width."""

    def __init__(self, *columns: str, title: str | None = None, caption: str | None = None):
        self.columns = tuple(columns)
        self.title = title
        self.caption = caption
        self.rows: list[tuple[str, ...]] = []

    def add_row(self, *cells: str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(tuple(cells))

    def table(self) -> Table:
        table = Table(*self.columns, title=self.title, caption=self.caption)
        for row in self.rows:
            table.add_row(*row)
        return table

    def fits(self, console: Console) -> bool:
        """Whether the full table, nothing wrapped, fits the console's width."""
        # rich clamps a measurement to the width it is given: measure against an unbounded one
        unbounded = console.options.update_width(1_000_000)
        return Measurement.get(console, unbounded, self.table()).maximum <= console.width

    def print(self, console: Console) -> None:
        if self.fits(console):
            console.print(self.table())
            return
        if self.title:
            console.print(Text(self.title, style="italic"))
        for row in self.rows:
            for line in stacked_lines(self.columns, row, console.width):
                console.print(Text(line), no_wrap=True, crop=False)
        if self.caption:
            console.print(Text(self.caption, style="dim"))


# a number and the unit after it wrap as one word: "25.83 ms", never "25.83" / "ms"
UNIT = re.compile(r"(ms|us|µs|ns|s|%|x|B|kB|MB|GB|TB|GB/s|MB/s|GFLOP/s|TFLOP/s|elems|calls|ranks)\b")


def words(text: str) -> list[str]:
    """The text's words, each number joined to the unit that follows it."""
    out: list[str] = []
    for word in text.split():
        if out and out[-1][-1:].isdigit() and UNIT.match(word):
            out[-1] += " " + word
        else:
            out.append(word)
    return out


def stacked_lines(columns: Sequence[str], row: Sequence[str], width: int) -> list[str]:
    """One row as `column: value` pairs, packed greedily into lines of at most `width` cells, the
    lines after the first indented; a pair longer than a line gets lines of its own, wrapped between
    words (a number kept with its unit). Empty cells are left out."""
    lines: list[str] = []
    open_line = False   # whether the next pair may join the last line

    def new_line(text: str) -> None:
        lines.append((" " * INDENT if lines else "") + text)

    for header, cell in zip(columns, row):
        value = Text.from_markup(cell).plain.strip() if cell else ""
        if not value:
            continue
        pair = f"{header}: {value}"
        if open_line and cell_len(lines[-1]) + len(PAIR_GAP) + cell_len(pair) <= width:
            lines[-1] += PAIR_GAP + pair
        elif cell_len(pair) <= width - (INDENT if lines else 0):
            new_line(pair)
            open_line = True
        else:
            for n, word in enumerate(words(pair)):
                if n and cell_len(lines[-1]) + 1 + cell_len(word) <= width:
                    lines[-1] += " " + word
                else:
                    new_line(word)
            open_line = False
    return lines
