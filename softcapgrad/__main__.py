"""``python -m softcapgrad``: the command line, with the working folder off the import path.

``python -m`` puts the working folder first on ``sys.path``, so a ``numpy.py`` or a folder named after an
optional package (``mlx``) there would be imported, or taken for installed, by the tool and the libraries it
imports. The entry is dropped before anything else is imported; the ``softcapgrad`` script never adds it.
"""

import os
import sys

if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from softcapgrad.cli.app import main  # noqa: E402 -- after the path is made safe

if __name__ == "__main__":
    main()
