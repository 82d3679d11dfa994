"""Strings of the frame: the sidebar's language switch (the other sidebar texts: phase 2 of issue 14)."""

STRINGS = {
    "app.language": ("Language / 语言", "语言 / Language"),
}
