"""The docs build: every measured number in README.md and docs/*.md rendered from a results file.

``results`` says which command writes which file in ``benchmarks/results/``; ``manifest`` says
which table renders from which files into which marked block of which page; ``captions`` and the
``*_tables`` modules are the renderers, one per kind of table, built on the library's own
formatters and registries. ``benchmarks/tables.py`` is the command that drives them.
"""
