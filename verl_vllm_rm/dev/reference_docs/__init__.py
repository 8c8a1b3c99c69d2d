"""The generated reference pages of the documentation site (``docs/reference/``), written and checked by
``verl-vllm-rm reference-docs [--check]`` (:mod:`.pages`).

One source of truth each: the option dataclasses and their attribute docstrings (:mod:`.sections`), the argparse
parsers of the CLI and of the reward server (:mod:`.flags`, :mod:`.server_flags`), and the ``raise`` statements of
the package (:mod:`.raises`). Kept free of imports here: the server's environment imports :mod:`.flags`.
"""
