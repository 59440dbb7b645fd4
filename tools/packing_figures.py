"""The figures of docs/packing.md: a packed row, and the fill of each packing method.

    python tools/packing_figures.py        # writes docs/img/packed_row.png and docs/img/packing_fill.png

The fill figure packs 20,000 sequences of log-normal lengths (median ~400 tokens, clipped to the
row) into rows of 2048 tokens, in their order; Grain's FirstFitPackIterDataset's rule is the
reference (up to N open rows, all emitted when a sequence fits none), as in tests/test_packing.py.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import lazyseq

IMG = Path(__file__).resolve().parent.parent / "docs" / "img"


def packed_row() -> None:
    docs = [np.arange(n) + 100 * k for k, n in enumerate([9, 5, 7, 3, 6, 4])]
    row = lazyseq.pack(docs, 16)[0]
    fig, axes = plt.subplots(3, 1, figsize=(7, 2.2), sharex=True)
    colors = plt.get_cmap("tab10")
    for ax, key in zip(axes, ("tokens", "segment_ids", "positions")):
        values = row[key]
        for x, (v, seg) in enumerate(zip(values, row["segment_ids"])):
            ax.add_patch(plt.Rectangle((x, 0), 1, 1, color="0.9" if seg == 0 else colors(int(seg) - 1), alpha=0.55))
            ax.text(x + 0.5, 0.5, str(int(v)), ha="center", va="center", fontsize=7)
        ax.set_xlim(0, len(values))
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_ylabel(key, rotation=0, ha="right", va="center", fontsize=8)
    axes[-1].set_xticks([])
    axes[0].set_title("a row of pack(docs, 16): segments 1..k, 0 = padding", fontsize=9)
    fig.tight_layout()
    fig.savefig(IMG / "packed_row.png", dpi=90)


def first_fit_rows(lengths: list[int], length: int, bins: int) -> int:
    rows, open_rows = 0, []
    for n in lengths:
        for k, room in enumerate(open_rows):
            if room >= n:
                open_rows[k] -= n
                break
        else:
            if len(open_rows) == bins:
                rows, open_rows = rows + len(open_rows), []
            open_rows.append(length - n)
    return rows + len(open_rows)


def fill_figure() -> None:
    rng = np.random.default_rng(0)
    length = 2048
    lengths = np.clip(rng.lognormal(6, 1, 20_000).astype(np.int64), 1, length)
    tokens = int(lengths.sum())
    names, fills = [], []
    for bins in (8, 64):
        names.append(f"Grain first fit\n{bins} bins")
        fills.append(tokens / (first_fit_rows(lengths.tolist(), length, bins) * length))
    for method in ("concat", "first_fit", "best_fit"):
        names.append(f"pack\n{method}")
        fills.append(lazyseq.pack(range(len(lengths)), length, method=method, lengths=lengths).fill())
    fig, ax = plt.subplots(figsize=(6, 2.4))
    bars = ax.bar(names, fills, color=["0.6", "0.6", "tab:blue", "tab:blue", "tab:blue"])
    for bar, f in zip(bars, fills):
        ax.text(bar.get_x() + bar.get_width() / 2, f + 0.002, f"{f:.3f}", ha="center", fontsize=8)
    ax.set_ylim(min(fills) - 0.02, 1.005)
    ax.set_ylabel("token slots filled", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_title("20,000 log-normal sequences into rows of 2048 (window=1024)", fontsize=9)
    fig.tight_layout()
    fig.savefig(IMG / "packing_fill.png", dpi=90)
    for n, f in zip(names, fills):
        print(n.replace("\n", " "), round(f, 4))


if __name__ == "__main__":
    packed_row()
    fill_figure()
