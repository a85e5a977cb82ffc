import sys

from cdcflow.cli import main

sys.exit(main())
