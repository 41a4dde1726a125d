"""Gavel plug-ins as a package of their own: installed, they are found by name (entry points in
pyproject.toml); not installed, by ``gavel_example_plugins.policies:WeightedShare`` with the
package on PYTHONPATH. docs/extending.md walks through each module."""
