"""Whole-model speed of every encoding as ratios to NoPE (see ``posenc speed model --help``).

The regression check: re-run and compare the ratios with benchmarks/results/model_speed_*.json.

    PYTHONPATH=src python benchmarks/model.py --lengths 1024 --json /tmp/model_speed.json
"""

import argparse
import sys

from posenc.cli import speed_model as model

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=model.__doc__.splitlines()[0])
    model.add_arguments(parser)
    sys.exit(model.run(parser.parse_args()))
