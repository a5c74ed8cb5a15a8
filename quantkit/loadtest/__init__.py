"""The load test's parts that need no server: the length model fitted to the user's traffic
(lengths.py), the latency objective (slo.py), and a ramp's steps summarised, the knee found and
goodput counted (ramp.py)."""
