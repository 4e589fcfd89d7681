"""The harness's pytest options, fixtures and hypothesis profile come from its plugin,
properties/pytest_plugin.py, which the `pytest11` entry point registers wherever the
project is installed (scripts/test installs it). A checkout that is not installed loads
it from here instead."""

from importlib.metadata import entry_points

if not any(ep.value == "properties.pytest_plugin" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["properties.pytest_plugin"]
