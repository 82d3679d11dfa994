"""Make ``explorer/static/cjk-subset.woff2``: Noto Sans CJK SC Regular cut down to the CJK characters the app's
sources hold.

    python3 assets/make_cjk_font.py [--folder /usr/share/fonts/opentype/noto]

Needs fonttools and brotli (``pip install 'fusion-explorer[fonts]'``) and the Noto Sans CJK collection
(Debian: ``fonts-noto-cjk``). Run it again after adding Chinese text with characters the font lacks:
``tests/test_fonts.py`` says which. The subset is renamed (the font license reserves the name "Source"
for the original), and its license is written beside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explorer.ui.fonts import FONT_PATH, characters_needed  # noqa: E402

FOLDER = "/usr/share/fonts/opentype/noto"
FACE = "Noto Sans CJK SC"
NAME = "Fusion Explorer CJK Subset"
LICENSE = FONT_PATH.with_name("cjk-subset.LICENSE.txt")


def subset_one(source: Path, target: Path, style: str, text: str) -> None:
    """``target``: the SC face of the collection ``source`` with only the glyphs of ``text``, renamed."""
    from fontTools import subset
    from fontTools.ttLib import TTCollection

    font = next(f for f in TTCollection(str(source)).fonts if f["name"].getDebugName(1) == FACE)
    options = subset.Options()
    options.flavor = "woff2"
    options.layout_features = ["*"]
    options.name_IDs = []            # names rewritten below
    options.notdef_outline = True
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=text)
    subsetter.subset(font)
    names = font["name"]
    for record_id, value in ((1, NAME), (2, style), (3, f"{NAME} {style}"), (4, f"{NAME} {style}"),
                             (6, NAME.replace(" ", "") + f"-{style}")):
        names.setName(value, record_id, 3, 1, 0x409)
    font.flavor = "woff2"
    target.parent.mkdir(parents=True, exist_ok=True)
    font.save(str(target))
    print(f"{target.relative_to(ROOT)}: {len(text)} characters, {target.stat().st_size / 1024:.0f} KiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", default=FOLDER, help=f"where NotoSansCJK-Regular.ttc is (default {FOLDER})")
    args = parser.parse_args()
    # the ideographic space and the full-width punctuation a sentence uses, beside the sources' characters
    text = "".join(sorted(characters_needed() | set("　、。，．：；？！（）「」『』《》〈〉“”‘’…—～·")))
    subset_one(Path(args.folder) / "NotoSansCJK-Regular.ttc", FONT_PATH, "Regular", text)
    LICENSE.write_text(
        f"{FONT_PATH.name}: a subset of Noto Sans CJK SC Regular ({len(text)} "
        "characters: those of the Fusion Explorer sources), made by assets/make_cjk_font.py and renamed as the "
        "license asks of a modified version.\n\nCopyright 2014-2021 Adobe (http://www.adobe.com/), with Reserved "
        "Font Name 'Source'.\n\nThis Font Software is licensed under the SIL Open Font License, Version 1.1: "
        "OFL-1.1.txt beside this file.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
