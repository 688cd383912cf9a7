import sys

from omnidraft.bench.benchmark import main

sys.exit(main())
