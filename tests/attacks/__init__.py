"""The attack matrix: every scoring path x an attack corpus, each attack with its honest score.

Files: ``tasks.py`` (the problems, in every shape), ``corpus.py`` (the attacks: one row each, and
``KNOWN_LIMITATIONS``, the one place for expected failures), ``programs.py`` (longer attack
sources), ``paths.py`` (the scoring paths: a mechanism in a fresh or a reused sandbox),
``conftest.py`` (one local Session per module; each path's results computed once per run),
``test_matrix.py`` (one test per cell: ``<mechanism>/<mode>:<attack>``).

How to add an attack: append one ``Attack`` to ``corpus.ATTACKS``: a unique name, a category, its
program per shape (``fn(src)`` for a function that both assert tests and the judge's calls score,
``fn_only(src)`` when only assert tests mean something, ``"stdin"`` / ``"cpp"`` for the judge's
programs; leave out the shapes it does not apply to), and the honest score (0.0 for an attack,
``kind=`` where the verdict's kind is certain). Files an earlier step could leave go in ``files``;
another task than ``tasks.SUM`` in ``task``; ``modes=("fresh",)`` for a slow attack a reused
sandbox adds nothing to. Nothing else changes.

How to add a scoring path: write a mechanism in ``paths.py`` (a ``name``, the ``shape`` of program
it scores, ``fresh`` for a list of completions each in a new sandbox, ``one`` for one completion in
a given sandbox, ``plant`` for files an earlier step leaves) and add it to ``MECHANISMS``; it gets
a fresh and a reused column. Nothing else changes.

A cell fails with the attack, the path, the expected and the actual score and the verdict's kind
and reason. Mark a cell as an expected failure only where the project's docs already call it a
limitation, in ``corpus.KNOWN_LIMITATIONS`` (strict: one that starts to hold fails too).
"""
