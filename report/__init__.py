"""Reporting: the results store (rows with provenance, atomic writes, skip-if-done), tables, plots and the wandb logger; it reads rows and imports no model code."""
