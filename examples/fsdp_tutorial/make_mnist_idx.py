"""Write MNIST-shaped IDX files without downloading anything.

    python examples/fsdp_tutorial/make_mnist_idx.py DIR [--source auto|sklearn|generated] [--seed 1]

writes DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte, 28x28 uint8 images
and labels 0-9, in MNIST's format (big-endian header, magic 2051/2049):

- ``sklearn``: scikit-learn's bundled handwritten digits (1,797 8x8 images),
  upsampled to 20x20 and centred in 28x28 as MNIST's digits are; shuffled
  with the seed, the last ``--test-fraction`` become t10k.
- ``generated``: digits drawn from a 5x7 pixel font, each one scaled,
  stretched, rotated, sheared, shifted, thickened or thinned and noised at
  random (``--train-size``/``--test-size`` images), so the classes are
  learnable but not trivially.
- ``auto`` (default): sklearn if it is installed, else generated.

The same arguments always give the same bytes. Needs only numpy.
"""
import argparse
import os
from typing import Dict, Tuple

import numpy as np

SIDE = 28
FONT = {  # 5 columns x 7 rows per digit
    0: ".###. #...# #..## #.#.# ##..# #...# .###.",
    1: "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    2: ".###. #...# ....# ...#. ..#.. .#... #####",
    3: "##### ...#. ..#.. ...#. ....# #...# .###.",
    4: "...#. ..##. .#.#. #..#. ##### ...#. ...#.",
    5: "##### #.... ####. ....# ....# #...# .###.",
    6: "..##. .#... #.... ####. #...# #...# .###.",
    7: "##### ....# ...#. ..#.. .#... .#... .#...",
    8: ".###. #...# #...# .###. #...# #...# .###.",
    9: ".###. #...# #...# .#### ....# ...#. .##..",
}


def glyphs() -> np.ndarray:
    """10 x 9 x 7 float glyphs: the font with a blank border (so sampling outside gives 0)."""
    rows = [[[c == "#" for c in row] for row in FONT[d].split()] for d in range(10)]
    return np.pad(np.array(rows, dtype=np.float64), ((0, 0), (1, 1), (1, 1)))


def _bilinear(images: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Sample each of ``images`` (n x h x w) at its own coordinates ``y``, ``x`` (n x ...), clamped."""
    n, h, w = images.shape
    y, x = np.clip(y, 0, h - 1), np.clip(x, 0, w - 1)
    y0, x0 = np.minimum(y.astype(int), h - 2), np.minimum(x.astype(int), w - 2)
    fy, fx = y - y0, x - x0
    i = np.arange(n).reshape((n,) + (1,) * (y.ndim - 1))
    top = images[i, y0, x0] * (1 - fx) + images[i, y0, x0 + 1] * fx
    bottom = images[i, y0 + 1, x0] * (1 - fx) + images[i, y0 + 1, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


def _draw(labels: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
    """Random affine renderings of the font's digits, as uint8 28x28 images."""
    n = len(labels)
    size = rng.uniform(2.3, 3.0, n)  # pixels per font cell, vertically
    width = size * rng.uniform(0.8, 1.25, n)
    angle, shear = rng.uniform(-0.2, 0.2, n), rng.uniform(-0.25, 0.25, n)
    centre = SIDE / 2 + rng.uniform(-2.5, 2.5, (2, n))
    threshold = rng.uniform(0.15, 0.45, n)  # low: thick strokes, high: thin ones
    col = lambda a: a[:, None, None]  # noqa: E731 - per-image value against the pixel grid
    ys, xs = np.mgrid[0:SIDE, 0:SIDE] + 0.5
    dy, dx = ys[None] - col(centre[0]), xs[None] - col(centre[1])
    cos, sin = col(np.cos(angle)), col(np.sin(angle))
    ry, rx = cos * dy - sin * dx, sin * dy + cos * dx  # rotate the grid back into the glyph's frame
    rx = rx - col(shear) * ry
    # glyph cell centres are at 0.5 .. 6.5 (rows) and 0.5 .. 4.5 (columns), +1 for the border
    ink = _bilinear(glyphs()[labels], ry / col(size) + 3.5 + 0.5, rx / col(width) + 2.5 + 0.5)
    image = np.clip((ink - col(threshold)) / 0.25, 0.0, 1.0) + rng.normal(0.0, 0.06, ink.shape)
    return np.round(np.clip(image, 0.0, 1.0) * 255).astype(np.uint8)


def generated(train_size: int, test_size: int, seed: int) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
    rng = np.random.RandomState(seed)
    out = {}
    for split, n in (("train", train_size), ("t10k", test_size)):
        labels = rng.randint(0, 10, n).astype(np.uint8)
        chunks = [_draw(labels[s:s + 4096], rng) for s in range(0, n, 4096)]  # bounded memory
        out[split] = (np.concatenate(chunks) if chunks else np.zeros((0, SIDE, SIDE), np.uint8), labels)
    return out


def _upsample_matrix(n_in: int, n_out: int) -> np.ndarray:
    """n_out x n_in bilinear interpolation weights (pixel centres aligned)."""
    pos = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    low = np.minimum(pos.astype(int), n_in - 2)
    weights = np.zeros((n_out, n_in))
    weights[np.arange(n_out), low] = 1 - (pos - low)
    weights[np.arange(n_out), low + 1] = pos - low
    return weights


def sklearn_digits(test_fraction: float, seed: int) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits  # optional dependency, bundled data (no download)

    digits = load_digits()
    small = np.asarray(digits.images, dtype=np.float64) / 16.0  # n x 8 x 8, values 0..16
    up = _upsample_matrix(small.shape[1], 20)
    box = np.einsum("ij,njk,lk->nil", up, small, up)  # each image: up @ img @ up.T
    images = np.zeros((len(small), SIDE, SIDE))
    images[:, 4:24, 4:24] = box  # MNIST centres its digits' 20x20 box in 28x28
    images = np.round(np.clip(images, 0.0, 1.0) * 255).astype(np.uint8)
    labels = np.asarray(digits.target, dtype=np.uint8)
    order = np.random.RandomState(seed).permutation(len(labels))
    n_test = int(round(len(labels) * test_fraction))
    train, test = order[:len(labels) - n_test], order[len(labels) - n_test:]
    return {"train": (images[train], labels[train]), "t10k": (images[test], labels[test])}


def write_idx(path: str, array: np.ndarray) -> None:
    """uint8 images (n x rows x cols, magic 2051) or labels (n, magic 2049), big-endian header."""
    magic = {3: 2051, 1: 2049}[array.ndim]
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with open(path, "wb") as f:
        f.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def sklearn_available() -> bool:
    try:
        import sklearn.datasets  # noqa: F401
    except ImportError:
        return False
    return True


def make_mnist_idx(out_dir: str, source: str = "auto", seed: int = 1, train_size: int = 60000,
                   test_size: int = 10000, test_fraction: float = 1 / 6) -> str:
    """Write the four IDX files into ``out_dir``; returns the source used."""
    if source == "auto":
        source = "sklearn" if sklearn_available() else "generated"
    splits = (sklearn_digits(test_fraction, seed) if source == "sklearn"
              else generated(train_size, test_size, seed))
    os.makedirs(out_dir, exist_ok=True)
    for prefix, (images, labels) in splits.items():
        write_idx(os.path.join(out_dir, f"{prefix}-images-idx3-ubyte"), images)
        write_idx(os.path.join(out_dir, f"{prefix}-labels-idx1-ubyte"), labels)
    return source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="directory to write the IDX files into (created if missing)")
    parser.add_argument("--source", choices=("auto", "sklearn", "generated"), default="auto")
    parser.add_argument("--seed", type=int, default=1, help="the same seed writes the same bytes")
    parser.add_argument("--train-size", type=int, default=60000, help="generated: training images")
    parser.add_argument("--test-size", type=int, default=10000, help="generated: t10k (validation) images")
    parser.add_argument("--test-fraction", type=float, default=1 / 6, help="sklearn: share of digits for t10k")
    args = parser.parse_args()
    if args.source == "sklearn" and not sklearn_available():
        parser.error("--source sklearn needs scikit-learn (pip install scikit-learn); or use --source generated")
    if min(args.train_size, args.test_size) < 1 or not 0 < args.test_fraction < 1:
        parser.error("--train-size and --test-size must be at least 1 and --test-fraction in (0, 1)")
    source = make_mnist_idx(args.out_dir, args.source, args.seed, args.train_size, args.test_size,
                            args.test_fraction)
    print(f"wrote {args.out_dir}/{{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte from {source} digits "
          f"(seed {args.seed})")


if __name__ == "__main__":
    main()
