"""`python -m bench`: the whole benchmark (see bench/README.md)."""

from bench.run import main

raise SystemExit(main())
