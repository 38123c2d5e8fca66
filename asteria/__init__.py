"""The `asteria` command: one table over the core's commands, the control plane's and the
benchmarks' (asteria/cli.py). Nothing in the product packages imports it."""
