"""RoPE speed side by side (see ``posenc speed rope --help``).

    PYTHONPATH=src python benchmarks/rope.py --lengths 512 2048 8192
"""

import argparse
import sys

from posenc.cli import speed_rope as rope

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=rope.__doc__.splitlines()[0])
    rope.add_arguments(parser)
    sys.exit(rope.run(parser.parse_args()))
