"""Pure planning algorithms (no I/O, no Beam), one per module, used by pipelines and the runtime."""
