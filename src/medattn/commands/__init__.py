"""Command-line commands; each module has add_arguments(parser) and run(args) -> int."""
