"""Relative attention terms vs a materialized (T, T, D) table; biased SDPA vs plain SDPA.

Same as ``posenc speed relative``; see :mod:`posenc.cli.speed_relative`. Example::

    PYTHONPATH=src python benchmarks/relative.py --lengths 512 1024 2048 4096 --json relative.json
"""

import argparse
import sys

from posenc.cli import speed_relative as relative

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    relative.add_arguments(parser)
    sys.exit(relative.run(parser.parse_args()))
