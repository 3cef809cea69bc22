"""``python -m posenc.rotary.build_cpu_kernel``: build the fused CPU rotary kernel
(:mod:`posenc.rotary.cpu_rope`) once for this machine, torch and Python; a no-op when it is
built. Exit status 1, with the reason, when it cannot be built (no writable folder, no C++
compiler or ninja): the library then rotates small CPU steps in eager PyTorch. Interrupted
(Ctrl-C): exit status 130, and the next run builds it again. Two processes building at once
take turns (torch's lock in the build folder); the second loads the first's build."""

from __future__ import annotations

import argparse
import sys

from .cpu_rope import build, build_directory, kernel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.rotary.build_cpu_kernel",
                                     description="Build the fused CPU rotary kernel (see posenc.rotary.cpu_rope).")
    parser.add_argument("--verbose", action="store_true", help="show the compiler's output")
    args = parser.parse_args(argv)
    if kernel() is not None:
        print(f"posenc: the fused CPU rotary kernel is built ({build_directory()})")
        return 0
    print(f"posenc: building the fused CPU rotary kernel in {build_directory()} (about 40 s)", flush=True)
    try:
        build(verbose=args.verbose)
    except RuntimeError as e:
        print(f"posenc: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the compiler's partial output is rebuilt by the next run
        print("posenc: interrupted; the kernel is not built", file=sys.stderr)
        return 130
    print("posenc: built")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
