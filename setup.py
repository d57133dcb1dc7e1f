"""Everything about the package is in pyproject.toml; this shim keeps `python setup.py ...`
and tools that look for setup.py working."""
from setuptools import setup

setup()
