"""The load test's parts: the traffic read as a server sees it (traffic.py), the length model
fitted to it (lengths.py), the requests drawn from both (requests.py), the latency objective
(slo.py), the ramp's policy, steps, knee and goodput (ramp.py), the launch config it serves with
(launch_config.py), one step's requests sent by the load generator (generator.py) and the report
(loadtest_report.py). workflows/loadtest.py drives them against a server."""
