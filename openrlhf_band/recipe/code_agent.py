"""Moved: see openrlhf_band/recipe/__init__.py."""

from openrlhf_band.recipe import moved_file

moved_file(__file__, __name__)
