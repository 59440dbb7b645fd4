"""python -m lazyseq.bench SCENARIO [--json FILE] [options]"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

SCENARIOS = {"views": "lazyseq.bench.views", "prefetch": "lazyseq.bench.prefetch", "tensor": "lazyseq.bench.tensor",
             "dataloader": "lazyseq.bench.dataloader", "store": "lazyseq.bench.store",
             "memory": "lazyseq.bench.memory", "ray": "lazyseq.bench.cluster", "report": "lazyseq.bench.report",
             "spdl": "lazyseq.bench.spdl", "tokens": "lazyseq.bench.tokens", "remote": "lazyseq.bench.remote",
             "formats": "lazyseq.bench.formats"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lazyseq.bench", description=__doc__)
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--only", metavar="PART[,PART]",
                    help="run only these parts: prefetch: large, tiny, compute, startup; formats: parquet, shards")
    ap.add_argument("--rounds", type=int, metavar="N", help="prefetch: rounds per loader (start-up: tries)")
    ap.add_argument("--tinygrad", metavar="DIR", help="tokens: a checkout of tinygrad, to compare with its MLPerf loader")
    ap.add_argument("--out", metavar="DIR", help="report: write benchmarks.md and img/ there (default: docs)")
    args = ap.parse_args(argv)
    options = {}
    if args.only or args.rounds is not None:
        if args.scenario != "prefetch" and (args.rounds is not None or args.scenario != "formats"):
            ap.error("--only applies to the prefetch and formats scenarios, --rounds to prefetch")
        if args.rounds is not None and (args.rounds < 1 or args.quick):
            ap.error("--rounds takes a number >= 1, without --quick")
        options = {"only": args.only.split(",") if args.only else None}
        if args.scenario == "prefetch":
            options["rounds"] = args.rounds
    if args.out:
        if args.scenario != "report":
            ap.error("--out applies to the report scenario")
        options["out"] = args.out
    if args.tinygrad:
        if args.scenario != "tokens":
            ap.error("--tinygrad applies to the tokens scenario")
        options["tinygrad"] = args.tinygrad
    results = importlib.import_module(SCENARIOS[args.scenario]).run(quick=args.quick, **options)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
