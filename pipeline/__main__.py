import sys

from pipeline.cli import main

if __name__ == "__main__":  # the guard matters: distributed's spawned workers re-import this module
    sys.exit(main())
