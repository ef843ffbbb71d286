"""Speed, measured on this machine: the benchmark ladder (`bench`), every technique verified (`check`) and the
profiler's verdict on what to fix next (`profiling`). Built on the training core."""
