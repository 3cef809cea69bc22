"""Does a fresh benchmark table agree with a committed one within the seeds' spread?

    python benchmarks/compare_bench.py out/bench/results.json benchmarks/results/bench_quick.json

Prints whether both tables read the same corpus (its sha256, recorded in results.json; "different
corpus: ... (committed table: ...)" where not, and then the cells of the tasks that read it are
listed but not judged), how many runs ended at bitwise the same training loss (the same
numerics: same CPU kind and thread count), how many table cells lie within 2 standard errors of
the seeds' spread, and the pooled verdict (posenc.bench.compare). Exit 0 when the tables agree,
1 when they do not, 2 when they cannot be compared (other settings or rows, a missing file).
"""

from __future__ import annotations

import argparse
import sys

from posenc.bench.compare import compare_files, format_comparison


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("fresh", help="results.json (or the output folder) of the fresh run")
    p.add_argument("committed", help="the committed results file to compare with")
    p.add_argument("--show", type=int, default=8, metavar="N", help="cells furthest apart to list (default 8)")
    args = p.parse_args(argv)
    try:
        comparison = compare_files(args.fresh, args.committed)
    except (OSError, ValueError) as e:
        print(f"compare_bench: {e}", file=sys.stderr)
        return 2
    print(f"posenc bench: {args.fresh} against {args.committed}")
    print(format_comparison(comparison, show=args.show))
    return 0 if comparison.agrees else 1


if __name__ == "__main__":
    sys.exit(main())
