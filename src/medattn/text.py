"""Plain text for people: tables for the terminal (benchmarks, cross-validation and comparison summaries) and
when progress bars are drawn (CSV files: :meth:`medattn.outputs.OutputFolder.save_csv`)."""

from __future__ import annotations


def bars_off(wanted: bool) -> bool | None:
    """tqdm's ``disable`` for progress bars that are ``wanted``: None draws them only when the output is a terminal
    (a log file gets no redraws), True never."""
    return None if wanted else True


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Plain-text table of ``rows``; ``columns`` are ``(key, header, format spec)``, missing values blank."""
    cells = [[header for _, header, _ in columns]]
    for row in rows:
        cells.append([
            "" if row.get(key) is None else format(row[key], spec) if spec else str(row[key])
            for key, _, spec in columns
        ])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells)

