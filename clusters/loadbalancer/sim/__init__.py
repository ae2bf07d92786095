"""`pulsar-chaos lb-sim`: the load balancer's own code (modular_leader, placement, shedding, splitting,
extensible/*) driven by simulated brokers, clients and time. Nothing here decides where a bundle goes:
every assignment, unload and split comes from the same objects the reference brokers run.

- `events`: the discrete-event core (simulated milliseconds, a heap, a seeded random generator).
- `params`: the model's parameters, each with its value and where it came from.
- `scenario`: scenarios (the seed's four, small ones, users' files) and their one-line errors.
- `cluster`: what both load managers share: namespaces and bundles, topics and their publishers,
  brokers with capacities and load signals, restarts/joins/leaves/hot spots, LB_EVENT records.
- `modular`, `extensible`: one wrapper each around the load manager's pure core.
- `run`: one simulation or a sweep, JSON and an offline HTML page.
"""
