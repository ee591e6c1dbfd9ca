"""flashcheck's internals: oracle, judging, cases, kernel adapters, campaigns and reports, GPU
benchmark, IO model, and the command line. Not a stable API: use ``import flashcheck``."""
