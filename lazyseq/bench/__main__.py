"""python -m lazyseq.bench SCENARIO [--json FILE] [options]"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

SCENARIOS = {"views": "lazyseq.bench.views", "prefetch": "lazyseq.bench.prefetch", "tensor": "lazyseq.bench.tensor",
             "dataloader": "lazyseq.bench.dataloader"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lazyseq.bench", description=__doc__)
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = ap.parse_args(argv)
    results = importlib.import_module(SCENARIOS[args.scenario]).run(quick=args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
