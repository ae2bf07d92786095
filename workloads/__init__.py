"""Workloads: one module per workload with its op generator, its client code and its checkers
(`workloads.log`: producers, Exclusive consumers and final reads over topics)."""
