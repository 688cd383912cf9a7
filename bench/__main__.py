import sys

from omnidraft.bench.cli import main

sys.exit(main())
