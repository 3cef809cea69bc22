"""``python -m posenc`` (and ``torchrun -m posenc``): the same entry as the ``posenc`` script.

Python imports the package before this file runs; ``posenc/__init__.py`` imports nothing, so
the Ctrl-C guard of :func:`posenc_entry.main` is on before torch loads, as for the script.
"""

from posenc_entry import main

main()
