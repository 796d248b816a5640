"""`python -m ringps ...` is the same as the `ringps` console script (and what torchrun runs)."""

from ringps.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
