"""Package list for setuptools (everything else is in pyproject.toml).

``splatloss.configs`` is the repository's root ``configs/`` folder, mapped into the package by
``[tool.setuptools.package-dir]``; package discovery cannot see it because it is not under ``splatloss/``.
"""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["splatloss", "splatloss.*"]) + ["splatloss.configs"])
