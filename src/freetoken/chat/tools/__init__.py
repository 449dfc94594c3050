"""Tool-call parsers: one file per model family's call syntax, one shared streaming machine."""
