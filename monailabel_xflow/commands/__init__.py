"""Sub-commands of ``xflow``: one module each, exposing ``register(subparsers)`` (see cli.py)."""
