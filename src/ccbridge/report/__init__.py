"""Reports: Markdown and self-contained HTML, rendered from rows (never re-measuring)."""
