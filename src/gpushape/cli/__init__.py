"""The `gpushape` command line."""
