"""``python -m posenc`` (and ``torchrun -m posenc``): the same entry as the ``posenc`` script.

Python imports the package (and torch) before this file runs; ``posenc/__init__.py`` puts the
Ctrl-C guard on first when it is imported this way (:func:`posenc_entry.run_as_main`), so an
interrupt during those imports is ``posenc: interrupted`` and exit 130, as for the script.
"""

from posenc_entry import main

main()
