"""Write a folder of PNG images (one sub-folder per digit, as torchvision's ImageFolder reads them) from gantools'
rendered glyphs, for the user-style scripts next to this file: `python glyph_pngs.py OUT [--n 2000] [--size 64]`."""
import argparse

from gantools.core.data import write_glyph_pngs


def write_pngs(root, n: int = 2000, size: int = 64, channels: int = 3, seed: int = 0):
    return write_glyph_pngs(root, n, size, channels, seed)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64)
    a = parser.parse_args()
    print(write_pngs(a.out, a.n, a.size))
