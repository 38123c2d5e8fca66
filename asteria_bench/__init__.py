"""`asteria bench`: every number Asteria publishes, reproduced by one command (docs/benchmarks.md).

Suites live one per module; each writes one JSON file (machine, versions, threads, commit, every
raw step time) and the report (docs/benchmarks.md and the README's performance section) is
rendered from those files only. The package sits above asteria_core and beside the control plane:
it talks to a served run over HTTP, as a client would, and never imports `backend`.
"""
