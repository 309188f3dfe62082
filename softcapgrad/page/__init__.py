"""The results as a static page: one matrix per model type, a cell per verdict, each cell's details on a click.

Reads the committed results (parity.json, train-parity.json, default-attention.json; incidents.json where it
exists) as data and imports nothing of the engines that measured them.
"""

from softcapgrad.page.site import Site, build

__all__ = ["Site", "build"]
