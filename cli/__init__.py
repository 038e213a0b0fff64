"""infer's command-line interface: Typer commands that call the library and render."""

__version__ = "0.1.0"
