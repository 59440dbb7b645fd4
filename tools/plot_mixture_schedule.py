"""The plot of docs/howto/mixture-schedule.md: the realised proportions of a scheduled mix over
positions, for a whole run and for a run that stopped at position P and went on with new weights.

Run from the repository root: ``python tools/plot_mixture_schedule.py`` (writes
docs/img/mixture-schedule.png; needs matplotlib). Counts come from ``mix.counts``: no item is read.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

import lazyseq

TOTAL, P, WINDOW = 600_000, 300_000, 4_000
OUT = Path(__file__).resolve().parent.parent / "docs" / "img" / "mixture-schedule.png"


def realised(mixed, source: int) -> tuple[list[int], list[float]]:
    """Source's share of each window of WINDOW items, from the counts at the windows' ends."""
    xs, ys = [], []
    for end in range(WINDOW, len(mixed) + 1, WINDOW):
        c0, c1 = mixed.counts(end - WINDOW)[source], mixed.counts(end)[source]
        xs.append(end - WINDOW // 2)
        ys.append((c1 - c0) / WINDOW)
    return xs, ys


def main() -> None:
    sched = lazyseq.schedule([(0, [0.9, 0.1]), (100_000, [0.5, 0.5]), (400_000, [0.2, 0.8])], interpolate="linear")
    later = sched.then(P, [(0, [0.7, 0.3])])  # stopped at P, going on with new weights
    web, code = lazyseq.arange(10**7), lazyseq.arange(10**7)
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    for s, label, style in ((sched, "schedule", "-"), (later, "sched.then(300_000, [(0, [0.7, 0.3])])", "--")):
        m = lazyseq.mix([web, code], weights=s, stop=TOTAL)
        ax.plot(*realised(m, 1), style, label=f"code, realised: {label}")
    xs = list(range(0, TOTAL, 2000))
    ax.plot(xs, [float(sched.fractions(x)[1]) for x in xs], ":", color="black", label="code, scheduled")
    ax.axvline(P, color="grey", lw=0.8)
    ax.set_xlabel("mix position (item index)")
    ax.set_ylabel(f"share of {WINDOW} items")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
