"""``python -m posenc`` (and ``torchrun -m posenc``): the same entry as the ``posenc`` script.

By the time this runs the package (and torch) is imported; the entry still guards the
building of the parser against Ctrl-C and turns any later one into ``posenc: interrupted``.
"""

from posenc_entry import main

main()
