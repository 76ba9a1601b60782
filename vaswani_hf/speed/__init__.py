"""Speed as explicit transforms of a model object (fast_cpu, fast_gpu, int8), never in the Hub files."""
