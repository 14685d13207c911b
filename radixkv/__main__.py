"""``python -m radixkv``: the same command line as the ``radixkv`` script."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="radixkv")
