"""`omnidraft-bench`: a tool that measures the engine against its peers; not part of the engine."""
