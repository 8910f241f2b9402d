"""ccbridge's version, in a module of its own: the stamp (env) and the CLI read it without importing the
package's __init__ (whose lazy attributes reach the loader)."""

__version__ = "0.1.0"  # pyproject.toml's [project] version, kept equal
